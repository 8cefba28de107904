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

int main(void) {
    char buf[65536];
    while (read(0, buf, sizeof buf) > 0) {
    }
    const char *cmd = getenv("CNI_COMMAND");
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
