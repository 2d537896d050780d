/* The kernels' fatbin (built by nvcc from cuda/kernels.cu), embedded read-only and
 * aligned under our own symbol names; FATBIN is the path, from the Makefile. */
    .section .rodata
    .balign 64
    .globl kiln_cuda_fatbin
kiln_cuda_fatbin:
    .incbin FATBIN
    .globl kiln_cuda_fatbin_end
kiln_cuda_fatbin_end:
    .byte 0
    .section .note.GNU-stack,"",@progbits
