/* conf.c: where the CLI's connection settings come from, lowest priority first:
 *   1. a config file: --config FILE, else $XDG_CONFIG_HOME/kiln/client.ini or
 *      ~/.config/kiln/client.ini (optional);
 *   2. the environment: KILN_HOST KILN_TOKEN KILN_CA KILN_CERT KILN_KEY;
 *   3. flags.
 * Each source fills a conf_conn layer with a `set` mask, and a later layer replaces only
 * what it sets (hosts as a whole list). The file parser is ours, not inih: the SDK links
 * only mbedTLS, and the format is small enough to parse strictly with bounded buffers. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

#define CONF_FILE_MAX (64 * 1024) /* a client.ini is a handful of lines */
#define CONF_LINE_MAX 2048
#define DEFAULT_PORT "8443"
#define DEFAULT_HOST "localhost:" DEFAULT_PORT

const char conf_flags_help[] =
    "connection (flags > environment > config file):\n"
    "  --host H:P[,H:P...]   server(s): a connection to each, requests to the least busy\n"
    "                        (repeatable; default " DEFAULT_HOST ")\n"
    "                        env KILN_HOST; IPv6 as [addr]:port; port defaults to " DEFAULT_PORT "\n"
    "  --token T             the HELLO token                        env KILN_TOKEN\n"
    "  --ca FILE             CA certificate(s) to trust (PEM)       env KILN_CA\n"
    "  --cert FILE --key FILE  client certificate and key for mTLS  env KILN_CERT, KILN_KEY\n"
    "  --server-name NAME    name to check in the server certificate (default: the host)\n"
    "  --timeout-ms MS       per server: connect + TLS + HELLO; and the longest wait for\n"
    "                        a byte from the server (default: 5000 and 30000)\n"
    "  --retries N           extra attempts: reconnect rounds over the host list, 503\n"
    "                        retries, resends after a broken connection (default 2)\n"
    "  --connections-per-host N  connections to each server (default 1); behind a TCP\n"
    "                        balancer (HAProxy mode tcp) N reach up to N boxes\n"
    "  --config FILE         settings file (default ~/.config/kiln/client.ini): lines\n"
    "                        `key = value` with keys host token ca cert key server_name\n"
    "                        timeout_ms retries connections_per_host; `#` or `;` starts a comment line;\n"
    "                        host may repeat; ~/ in paths is the home directory\n"
    "  -v, --verbose         usage and connection details on stderr\n";

void conf_init(conf_conn *c) {
    memset(c, 0, sizeof *c);
    c->retries = -1;
}

/* Copies s into out[cap] or fails (never truncates: a cut path or token is wrong). */
static int copy_str(char *out, size_t cap, const char *s, size_t len) {
    if (len >= cap) return -1;
    memcpy(out, s, len);
    out[len] = '\0';
    return 0;
}

/* One "host[:port]" or "[v6][:port]" into "host:port" form. 0 or -1. */
static int norm_host(const char *s, size_t len, char *out, size_t cap) {
    const char *port = NULL;
    size_t hlen = len;
    if (len && s[0] == '[') {
        const char *rb = memchr(s, ']', len);
        if (!rb || rb == s + 1) return -1;
        hlen = (size_t)(rb - s) + 1;
        if (hlen < len) {
            if (s[hlen] != ':') return -1;
            port = s + hlen + 1;
        }
    } else {
        const char *colon = memchr(s, ':', len);
        if (colon) {
            if (memchr(colon + 1, ':', len - (size_t)(colon + 1 - s)))
                return -1; /* a bare IPv6 address: needs [brackets] */
            hlen = (size_t)(colon - s);
            port = colon + 1;
        }
    }
    if (hlen == 0 || hlen > 255) return -1;
    for (size_t i = 0; i < hlen; i++)
        if (s[i] <= ' ' || s[i] == 0x7f || s[i] == '/' || s[i] == '@') return -1;
    char pbuf[8];
    size_t plen = port ? len - (size_t)(port - s) : 0;
    if (port) {
        long p;
        if (plen == 0 || plen >= sizeof pbuf) return -1;
        memcpy(pbuf, port, plen);
        pbuf[plen] = '\0';
        if (parse_long(pbuf, 1, 65535, &p) < 0 || pbuf[0] == '-') return -1;
    } else {
        snprintf(pbuf, sizeof pbuf, "%s", DEFAULT_PORT);
    }
    int n = snprintf(out, cap, "%.*s:%s", (int)hlen, s, pbuf);
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

int conf_add_hosts(conf_conn *c, const char *list, const char *what) {
    const char *s = list;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        while (len && s[0] == ' ') s++, len--;
        while (len && s[len - 1] == ' ') len--;
        if (c->n_hosts >= CONF_MAX_HOSTS) {
            cli_err("%s: more than %d hosts", what, CONF_MAX_HOSTS);
            return -1;
        }
        if (norm_host(s, len, c->hosts[c->n_hosts], CONF_HOST_MAX) < 0) {
            cli_err("%s: bad host '%.*s' (want host:port, [v6addr]:port)", what,
                    (int)(len > 80 ? 80 : len), s);
            return -1;
        }
        c->n_hosts++;
        if (!comma) break;
        s = comma + 1;
    }
    c->set |= CS_HOSTS;
    return 0;
}

/* "~/x" -> "$HOME/x" for paths written in the config file. */
static int expand_path(const char *v, char *out, size_t cap) {
    if (v[0] == '~' && v[1] == '/') {
        const char *home = getenv("HOME");
        if (!home || !*home) return -1;
        int n = snprintf(out, cap, "%s%s", home, v + 1);
        return n > 0 && (size_t)n < cap ? 0 : -1;
    }
    return copy_str(out, cap, v, strlen(v));
}

/* Sets one key from the file. 0, -1 (bad value), -2 (unknown key). */
static int conf_set_key(conf_conn *c, const char *key, const char *val, const char *where) {
    long n;
    if (strcmp(key, "host") == 0) return conf_add_hosts(c, val, where);
    if (strcmp(key, "token") == 0) {
        if (copy_str(c->token, sizeof c->token, val, strlen(val)) < 0 || !*val) goto bad;
        c->set |= CS_TOKEN;
    } else if (strcmp(key, "ca") == 0) {
        if (expand_path(val, c->ca, sizeof c->ca) < 0 || !*val) goto bad;
        c->set |= CS_CA;
    } else if (strcmp(key, "cert") == 0) {
        if (expand_path(val, c->cert, sizeof c->cert) < 0 || !*val) goto bad;
        c->set |= CS_CERT;
    } else if (strcmp(key, "key") == 0) {
        if (expand_path(val, c->key, sizeof c->key) < 0 || !*val) goto bad;
        c->set |= CS_KEY;
    } else if (strcmp(key, "server_name") == 0) {
        if (copy_str(c->server_name, sizeof c->server_name, val, strlen(val)) < 0 || !*val) goto bad;
        c->set |= CS_SERVER_NAME;
    } else if (strcmp(key, "timeout_ms") == 0) {
        if (parse_long(val, 1, 3600 * 1000L, &n) < 0) goto bad;
        c->timeout_ms = (int)n, c->set |= CS_TIMEOUT;
    } else if (strcmp(key, "retries") == 0) {
        if (parse_long(val, 0, 100, &n) < 0) goto bad;
        c->retries = (int)n, c->set |= CS_RETRIES;
    } else if (strcmp(key, "connections_per_host") == 0) {
        if (parse_long(val, 1, 64, &n) < 0) goto bad;
        c->per_host = (int)n, c->set |= CS_PER_HOST;
    } else {
        cli_err("%s: unknown key '%.40s' (keys: host token ca cert key server_name timeout_ms retries "
                "connections_per_host)",
                where, key);
        return -2;
    }
    return 0;
bad:
    cli_err("%s: bad value for %s", where, key);
    return -1;
}

/* One line of the file (no '\n'), in place. 0 or -1 (message printed). */
static int conf_line(conf_conn *c, char *line, const char *where, unsigned *seen) {
    char *s = line;
    size_t len = strlen(s);
    if (len && s[len - 1] == '\r') s[--len] = '\0';
    while (*s == ' ' || *s == '\t') s++;
    if (!*s || *s == '#' || *s == ';') return 0;
    char *k = s;
    while ((*s >= 'a' && *s <= 'z') || *s == '_') s++;
    size_t klen = (size_t)(s - k);
    while (*s == ' ' || *s == '\t') s++;
    if (klen == 0 || klen > 32 || *s != '=') {
        cli_err("%s: expected `key = value`", where);
        return -1;
    }
    k[klen] = '\0';
    s++;
    while (*s == ' ' || *s == '\t') s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t')) *--end = '\0';
    /* "quoted" keeps leading/trailing spaces; there are no escapes */
    if (end - s >= 2 && s[0] == '"' && end[-1] == '"') s++, *--end = '\0';
    for (char *q = s; *q; q++)
        if ((unsigned char)*q < 0x20 || *q == 0x7f) {
            cli_err("%s: control character in value", where);
            return -1;
        }
    /* only host may repeat: a second `token =` is more likely a mistake than intent */
    static const char *const once[] = {"token", "ca", "cert", "key", "server_name",
                                       "timeout_ms", "retries", "connections_per_host"};
    for (unsigned i = 0; i < sizeof once / sizeof *once; i++) {
        if (strcmp(k, once[i]) != 0) continue;
        if (*seen & (1u << i)) {
            cli_err("%s: %s given twice", where, k);
            return -1;
        }
        *seen |= 1u << i;
    }
    return conf_set_key(c, k, s, where) < 0 ? -1 : 0;
}

int conf_load_file(conf_conn *c, const char *path, int must_exist) {
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT && !must_exist) return 0;
        cli_err("config %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > CONF_FILE_MAX) {
        cli_err("config %s: not a regular file of at most %d bytes", path, CONF_FILE_MAX);
        fclose(f);
        return -1;
    }
    conf_conn file;
    conf_init(&file);
    char line[CONF_LINE_MAX], where[CONF_PATH_MAX + 32];
    unsigned seen = 0;
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        snprintf(where, sizeof where, "config %s:%d", path, lineno);
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n') line[--len] = '\0';
        else if (!feof(f)) {
            cli_err("%s: line longer than %d bytes", where, CONF_LINE_MAX - 2);
            rc = -1;
            break;
        }
        rc = conf_line(&file, line, where, &seen);
    }
    fclose(f);
    if (rc == 0) conf_merge(c, &file);
    return rc;
}

/* One environment variable into a string setting. */
static int env_str(const char *name, char *out, size_t cap, unsigned bit, conf_conn *c) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    if (copy_str(out, cap, v, strlen(v)) < 0) {
        cli_err("%s: too long", name);
        return -1;
    }
    c->set |= bit;
    return 0;
}

int conf_load_env(conf_conn *c) {
    const char *h = getenv("KILN_HOST");
    if (h && *h && conf_add_hosts(c, h, "KILN_HOST") < 0) return -1;
    if (env_str("KILN_TOKEN", c->token, sizeof c->token, CS_TOKEN, c) < 0) return -1;
    if (env_str("KILN_CA", c->ca, sizeof c->ca, CS_CA, c) < 0) return -1;
    if (env_str("KILN_CERT", c->cert, sizeof c->cert, CS_CERT, c) < 0) return -1;
    if (env_str("KILN_KEY", c->key, sizeof c->key, CS_KEY, c) < 0) return -1;
    return 0;
}

void conf_merge(conf_conn *dst, const conf_conn *src) {
    if (src->set & CS_HOSTS) {
        memcpy(dst->hosts, src->hosts, sizeof dst->hosts);
        dst->n_hosts = src->n_hosts;
    }
    if (src->set & CS_TOKEN) memcpy(dst->token, src->token, sizeof dst->token);
    if (src->set & CS_CA) memcpy(dst->ca, src->ca, sizeof dst->ca);
    if (src->set & CS_CERT) memcpy(dst->cert, src->cert, sizeof dst->cert);
    if (src->set & CS_KEY) memcpy(dst->key, src->key, sizeof dst->key);
    if (src->set & CS_SERVER_NAME) memcpy(dst->server_name, src->server_name, sizeof dst->server_name);
    if (src->set & CS_TIMEOUT) dst->timeout_ms = src->timeout_ms;
    if (src->set & CS_RETRIES) dst->retries = src->retries;
    if (src->set & CS_PER_HOST) dst->per_host = src->per_host;
    dst->set |= src->set;
}

/* The default config file path, or "" when there is no home to look in. */
static void default_config(char *out, size_t cap) {
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    int n = -1;
    if (xdg && xdg[0] == '/') n = snprintf(out, cap, "%s/kiln/client.ini", xdg);
    else if (home && *home) n = snprintf(out, cap, "%s/.config/kiln/client.ini", home);
    if (n < 0 || (size_t)n >= cap) out[0] = '\0';
}

int conf_resolve(const cli_global *g, conf_conn *out) {
    conf_init(out);
    char path[CONF_PATH_MAX];
    if (g->config) {
        if (conf_load_file(out, g->config, 1) < 0) return -1;
    } else {
        default_config(path, sizeof path);
        if (path[0] && conf_load_file(out, path, 0) < 0) return -1;
    }
    conf_conn env;
    conf_init(&env);
    if (conf_load_env(&env) < 0) return -1;
    conf_merge(out, &env);
    conf_merge(out, &g->flags);
    if (out->n_hosts == 0) conf_add_hosts(out, DEFAULT_HOST, "default");
    if (!!out->cert[0] != !!out->key[0]) {
        cli_err("--cert and --key go together (mTLS needs both)");
        return -1;
    }
    return 0;
}

/* A string flag into a fixed buffer. */
static int flag_str(argp *p, char *out, size_t cap, unsigned bit, conf_conn *c) {
    const char *v;
    if (argp_str(p, &v) < 0) return -1;
    if (!*v || copy_str(out, cap, v, strlen(v)) < 0) {
        cli_err("%s: %.*s: empty or too long", p->cmd, (int)p->name_len, p->arg);
        return -1;
    }
    c->set |= bit;
    return 0;
}

int conf_flag(argp *p, cli_global *g) {
    conf_conn *c = &g->flags;
    const char *v;
    int r;
    if (argp_is(p, "--host")) {
        if (argp_str(p, &v) < 0) return -1;
        r = conf_add_hosts(c, v, "--host");
    } else if (argp_is(p, "--token")) r = flag_str(p, c->token, sizeof c->token, CS_TOKEN, c);
    else if (argp_is(p, "--ca")) r = flag_str(p, c->ca, sizeof c->ca, CS_CA, c);
    else if (argp_is(p, "--cert")) r = flag_str(p, c->cert, sizeof c->cert, CS_CERT, c);
    else if (argp_is(p, "--key")) r = flag_str(p, c->key, sizeof c->key, CS_KEY, c);
    else if (argp_is(p, "--server-name"))
        r = flag_str(p, c->server_name, sizeof c->server_name, CS_SERVER_NAME, c);
    else if (argp_is(p, "--timeout-ms")) {
        r = argp_int(p, &c->timeout_ms, 1, 3600 * 1000L);
        c->set |= CS_TIMEOUT;
    } else if (argp_is(p, "--retries")) {
        r = argp_int(p, &c->retries, 0, 100);
        c->set |= CS_RETRIES;
    } else if (argp_is(p, "--connections-per-host")) {
        r = argp_int(p, &c->per_host, 1, 64);
        c->set |= CS_PER_HOST;
    } else if (argp_is(p, "--config")) r = argp_str(p, &g->config);
    else if (argp_is(p, "--verbose") || argp_is(p, "-v")) {
        r = argp_no_value(p);
        g->verbose = 1;
    } else return 0;
    return r < 0 ? -1 : 1;
}
