/* ini: just enough of kiln.ini for kiln-init: read one key (the hostname, `config get`
 * when kilnd is down) and rewrite one key in place for `config set`, keeping every other
 * line, comment and the key's own trailing comment. Lines are parsed by inih, as kilnd
 * parses them. The file is rewritten through a
 * temporary file and rename(), so a power cut leaves the old or the new file, never half. */
#ifndef KILN_BOOT_INI_H
#define KILN_BOOT_INI_H

#include <stddef.h>

#define INI_MAX_BYTES 65536 /* a kiln.ini is a few KiB */

int ini_get(const char *path, const char *section, const char *key, char *out, size_t cap); /* 0, -ENOENT */
int ini_set(const char *path, const char *section, const char *key, const char *value, char *err, size_t cap);
int ini_split_name(const char *name, char *sec, size_t scap, char *key, size_t kcap); /* "net.listen" */

#endif
