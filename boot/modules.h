/* modules: loads the kernel modules listed in /etc/kiln/modules (one path a line, relative
 * to /lib/modules/<uname -r>/, already in dependency order: the image build resolved it)
 * with finit_module. Compressed modules (.ko.xz, .ko.zst, .ko.gz) are decompressed by the
 * kernel (MODULE_INIT_COMPRESSED_FILE). A module that is already there (EEXIST) counts as
 * loaded; a failure is logged and the next one is tried: a missing GPU driver must not
 * cost the box its console. */
#ifndef KILN_BOOT_MODULES_H
#define KILN_BOOT_MODULES_H

typedef struct {
    int loaded;   /* modules now in the kernel */
    int failed;   /* modules that did not load */
    int first_err;          /* errno of the first failure (0: none) */
    char first_failed[96];  /* its file name ("nvidia.ko"), "" when none failed */
    double secs;  /* time taken */
} mod_result;

int mod_load_list(const char *list_path, const char *mod_dir, mod_result *res); /* 0, or -errno for the list */
/* The same, stopping at the first module that fails (what comes after it depends on it). */
int mod_load_list_until_failure(const char *list_path, const char *mod_dir, mod_result *res);

#endif
