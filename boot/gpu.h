/* gpu: the NVIDIA GPUs on the PCI bus and their kernel driver, brought up by kiln-init
 * before kilnd starts (kilnd's `backend = auto` then finds the device, or serves from
 * the CPU and says why).
 *
 * Bring-up: the PCI scan (ROOT/sys/bus/pci/devices: vendor 0x10de, class 0x03xxxx, a
 * display or 3D controller); with a GPU there and the driver in the image (its modules
 * listed in /etc/kiln/modules-gpu, in dependency order, as /etc/kiln/modules), the
 * modules are loaded and the character devices the CUDA driver opens are made from the
 * majors in /proc/devices: /dev/nvidiactl and /dev/nvidiaN (nvidia-frontend), and
 * /dev/nvidia-uvm, /dev/nvidia-uvm-tools (nvidia-uvm). Nothing of it is fatal: every
 * outcome is one line (gpu_state.line) on the console and in `status`, and the box
 * serves from the CPU. With no GPU on the bus but the driver in the image, its modules are
 * still loaded up to the first failure, as a check that they fit the kernel (without a GPU
 * nvidia.ko refuses with ENODEV: its symbols resolved). Test mode scans ROOT's tree and
 * never loads modules (the nodes are made under ROOT/dev when ROOT/proc/devices is there). */
#ifndef KILN_BOOT_GPU_H
#define KILN_BOOT_GPU_H

#include <signal.h>
#include <stddef.h>

#define GPU_MAX 16 /* GPUs listed; a box has at most 8 */

typedef struct {
    char bus[16];          /* "0000:01:00.0" */
    unsigned device, class_code;
} gpu_dev;

typedef struct {
    int n;                 /* NVIDIA GPUs found (at most GPU_MAX listed) */
    gpu_dev dev[GPU_MAX];
    int pci_seen;          /* PCI functions looked at; -1: no PCI tree */
    int driver;            /* 1: the image lists GPU modules */
    int loaded, failed;    /* of those modules */
    int nodes;             /* device nodes made (or already there) */
    char line[256];        /* the outcome in one line */
    char cublas[400];      /* gpu_check_cublas's line; "" when the data partition has no cuBLAS */
} gpu_state;

/* Fills g from ROOT/sys/bus/pci/devices ("" on the box). 0, or -errno without a PCI tree
 * (g->pci_seen -1, g->line says so). */
int gpu_scan(const char *root, gpu_state *g);
/* The whole bring-up: scan, then (load != 0) the modules of ROOT/etc/kiln/modules-gpu
 * from mod_dir and the device nodes. g->line says what came of it. */
void gpu_bring_up(gpu_state *g, const char *root, const char *mod_dir, int load);
/* The console's `gpu`: g's line, each GPU, and the driver's own view when it is loaded
 * (ROOT/proc/driver/nvidia: its version, each GPU's information file), one fact per
 * line. The bytes written (< cap). */
size_t gpu_describe(const gpu_state *g, const char *root, char *buf, size_t cap);

/* Which kilnd to run (ROOT-relative path into out): the GPU image's glibc CUDA kilnd,
 * GPU_KILND_CUDA, when the image has it and its loader (GPU_KILND_LOADER) and kiln.ini's
 * [engine] backend is not `cpu` (auto or cuda: it serves from the GPU when there is one,
 * else from the CPU and says so); otherwise the static musl GPU_KILND_CPU. why gets the
 * reason in a few words. 1 when the CUDA kilnd was chosen, 0 otherwise. */
#define GPU_KILND_CPU "/bin/kilnd"
#define GPU_KILND_CUDA "/bin/kilnd-cuda"
#define GPU_KILND_LOADER "/lib64/ld-linux-x86-64.so.2"
int gpu_pick_kilnd(const char *root, const char *ini, char *out, size_t cap, char *why, size_t wcap);

/* cuBLAS on the data partition (make disk-gpu): the GPU disk carries libcublas.so.12,
 * libcublasLt.so.12 and libgcc_s.so.1 in GPU_DATA_LIB, too large for the initramfs. The
 * CUDA kilnd gets it as its LD_LIBRARY_PATH (GPU_DATA_LIB_ENV) when the folder is there; the
 * CPU image's disk has none and its kilnd's environment stays as it was. */
#define GPU_DATA_LIB "/data/lib/cuda"
#define GPU_DATA_LIB_ENV "LD_LIBRARY_PATH=" GPU_DATA_LIB
#define GPU_CUBLAS "libcublas.so.12"
/* 1 when ROOT/GPU_DATA_LIB is a directory. */
int gpu_data_lib(const char *root);
/* The check the CUDA kilnd's dlopen would make, done at boot so a broken data partition is
 * said before anyone asks for cuBLAS: the image's loader (GPU_KILND_LOADER) lists
 * GPU_CUBLAS with GPU_DATA_LIB as its library path, a child with child_mask and no
 * environment, bounded by a few seconds. 0 when every library resolved and libcublasLt
 * came from that folder; negative otherwise. line gets the console line either way. */
int gpu_check_cublas(const char *root, const sigset_t *child_mask, char *line, size_t cap);

#endif
