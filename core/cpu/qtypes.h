/* qtypes: the tensor element type numbers (GGUF's ggml_type numbering), the one
 * definition: core/cpu/quant.h and cuda/kernels.cu (nvcc, C++) both include it, so the
 * CPU and GPU sides cannot disagree on a number. Plain C, nothing else. */
#ifndef KILN_QTYPES_H
#define KILN_QTYPES_H

enum qtype {
    QT_F32 = 0, QT_F16 = 1, QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q5_0 = 6, QT_Q5_1 = 7,
    QT_Q8_0 = 8, QT_Q8_1 = 9, QT_Q4_K = 12, QT_Q5_K = 13, QT_Q6_K = 14, QT_Q8_K = 15,
    QT_BF16 = 30, QT_COUNT = 31,
};

#endif
