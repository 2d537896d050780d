/* cu: loading the CUDA driver at run time (see cu.h). */
#include "cuda/cu.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static cu_api g_cu;
static char g_err[256];
static int g_state; /* 0 not tried, 1 loaded, -1 failed (g_err says why) */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static void load_once(void) {
    g_state = -1;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(g_err, sizeof g_err, "no NVIDIA driver: libcuda.so.1 not found");
        return;
    }
    /* The plain "cuGetProcAddress" symbol is the old four-argument ABI. */
    get_proc_fn get = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
    __typeof__(&cuDriverGetVersion) ver = (__typeof__(&cuDriverGetVersion))dlsym(lib, "cuDriverGetVersion");
    int dv = 0;
    if (!get || !ver || ver(&dv) != CUDA_SUCCESS || dv < 12000) {
        snprintf(g_err, sizeof g_err, "the NVIDIA driver is too old (CUDA %d.%d; 12.0 or later needed)",
                 dv / 1000, dv % 1000 / 10);
        dlclose(lib);
        return;
    }
    /* Ask for the ABI of the header we were compiled against, or the driver's own
     * version when it is older (asking for a newer one is an error). */
    int want = dv < CUDA_VERSION ? dv : CUDA_VERSION;
    CUdriverProcAddressQueryResult st;
#define CU_GET(name)                                                                       \
    if (get(#name, (void **)&g_cu.name, want, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || \
        !g_cu.name) {                                                                      \
        snprintf(g_err, sizeof g_err, "the NVIDIA driver lacks %s", #name);                \
        dlclose(lib);                                                                      \
        return;                                                                            \
    }
    CU_FUNCS(CU_GET)
#undef CU_GET
    g_cu.driver_version = dv;
    g_cu.lib = lib;
    CUresult r = g_cu.cuInit(0);
    int n = 0;
    if (r == CUDA_SUCCESS) r = g_cu.cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS || n < 1) {
        const char *s = NULL;
        if (r != CUDA_SUCCESS) g_cu.cuGetErrorString(r, &s);
        snprintf(g_err, sizeof g_err, "no CUDA device (%s)", s ? s : "none found");
        return; /* the library stays loaded: unloading a driver is not worth the risk */
    }
    g_state = 1;
}

const cu_api *cu_load(char *err, size_t errlen) {
    pthread_once(&g_once, load_once);
    if (g_state == 1) return &g_cu;
    if (err && errlen) snprintf(err, errlen, "%s", g_err);
    return NULL;
}

int cu_fail(const cu_api *cu, CUresult r, const char *what, char *err, size_t errlen) {
    const char *s = NULL;
    if (cu && cu->cuGetErrorString) cu->cuGetErrorString(r, &s);
    if (err && errlen) snprintf(err, errlen, "%s: %s (%d)", what, s ? s : "unknown error", (int)r);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
}
