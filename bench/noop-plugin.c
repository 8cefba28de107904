/*
 * noop-plugin: a chained CNI plugin that does nothing, in C — what libcni's handling of
 * one more plugin in a chain costs, with (almost) nothing of the plugin's own.
 * Reads stdin, answers ADD with an empty 1.0.0 result (the conflists of bench/run.sh
 * are 1.0.0), VERSION with its versions, anything else with no output.
 *
 * Built with -DREWRITE=\"PATH\" it writes as the tail does instead (bench/run.sh row 2e):
 * on ADD it reads the file PATH and replaces it the way the tail writes its note
 * (temporary file 0600, write, rename over the name; no fsync: docs/CHAIN.md).
 * Add -DREWRITE_SYNC for the fsync before the rename that the tail made until it wrote
 * notes (what a durable rewrite costs inside a chain).
 *
 * Built with -DTAIL_DIR=\"DIR\" it does the tail's ADD and nothing more (row 2h): prints
 * its prevResult back, and writes a new file DIR/<container ID>.json of a note's size
 * the way the tail writes a note (temporary file, write, rename; no fsync); DEL removes
 * the file. What a tail costs without being cni-ledger.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef REWRITE
#include <fcntl.h>

static void rewrite(void) {
    char old[4096], tmp[4200], rec[1024];
    int fd = open(REWRITE, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        while (read(fd, old, sizeof old) > 0) {
        }
        close(fd);
    }
    memset(rec, 'x', sizeof rec);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", REWRITE, (int)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    int ok = fd >= 0 && write(fd, rec, sizeof rec) == (ssize_t)sizeof rec;
#ifdef REWRITE_SYNC
    ok = ok && fsync(fd) == 0;
#endif
    if (!ok || close(fd) < 0 || rename(tmp, REWRITE) < 0) {
        perror(REWRITE);
        exit(1);
    }
}
#endif

#ifdef TAIL_DIR
#include <fcntl.h>

/* The object after "prevResult" in the config, or NULL; its length in *len. */
static const char *prev_result(const char *in, size_t n, size_t *len) {
    const char *p = strstr(in, "\"prevResult\"");
    if (!p || !(p = strchr(p + 12, '{')))
        return NULL;
    int depth = 0, str = 0, esc = 0;
    for (const char *q = p; q < in + n; q++) {
        char c = *q;
        if (str) {
            if (esc)
                esc = 0;
            else if (c == '\\')
                esc = 1;
            else if (c == '"')
                str = 0;
        } else if (c == '"')
            str = 1;
        else if (c == '{')
            depth++;
        else if (c == '}' && --depth == 0) {
            *len = (size_t)(q + 1 - p);
            return p;
        }
    }
    return NULL;
}

static void note(const char *cid, int add) {
    char dst[4096], tmp[4200], body[544];
    snprintf(dst, sizeof dst, "%s/%s.json", TAIL_DIR, cid);
    if (!add) {
        unlink(dst);
        return;
    }
    memset(body, 'x', sizeof body);
    snprintf(tmp, sizeof tmp, "%s/.tmp.%s.%d", TAIL_DIR, cid, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, body, sizeof body) != (ssize_t)sizeof body || close(fd) < 0 ||
        rename(tmp, dst) < 0) {
        perror(dst);
        exit(1);
    }
}
#endif

int main(void) {
    static char buf[65536];
    size_t n = 0;
    ssize_t got;
    while ((got = read(0, buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)got;
    buf[n] = 0;
    const char *cmd = getenv("CNI_COMMAND");
#ifdef TAIL_DIR
    const char *cid = getenv("CNI_CONTAINERID");
    if (cmd && cid && (!strcmp(cmd, "ADD") || !strcmp(cmd, "DEL")))
        note(cid, !strcmp(cmd, "ADD"));
    size_t len = 0;
    const char *prev = prev_result(buf, n, &len);
    if (cmd && !strcmp(cmd, "ADD") && prev) {
        fwrite(prev, 1, len, stdout);
        fputc('\n', stdout);
    } else
#endif
    if (cmd && !strcmp(cmd, "ADD")) {
#ifdef REWRITE
        rewrite();
#endif
        fputs("{\"cniVersion\":\"1.0.0\",\"dns\":{}}\n", stdout);
    } else if (cmd && !strcmp(cmd, "VERSION"))
        fputs("{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.3.0\",\"0.3.1\",\"0.4.0\","
              "\"1.0.0\"]}\n",
              stdout);
    return 0;
}
