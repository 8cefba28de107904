/*
 * durable-write: the floor for one ledger ADD — one process that makes one small file
 * durable exactly the way the ledger does (temp file 0600, write, fsync, rename,
 * fsync of the directory) and nothing else.
 *
 *   durable-write DIR NAME [BYTES=600]   write DIR/NAME durably
 *   durable-write --rm DIR NAME           unlink DIR/NAME and fsync DIR (untimed reset)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void fail(const char *what) {
    perror(what);
    exit(1);
}

static void fsync_dir(const char *dir) {
    int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d < 0 || fsync(d) < 0) fail(dir);
    close(d);
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "--rm")) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[2], argv[3]);
        if (unlink(path) < 0) fail(path);
        fsync_dir(argv[2]);
        return 0;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: durable-write DIR NAME [BYTES] | --rm DIR NAME\n");
        return 2;
    }
    size_t n = argc > 3 ? (size_t)atol(argv[3]) : 600;
    char *buf = malloc(n);
    memset(buf, 'x', n);
    if (n) buf[n - 1] = '\n';
    char tmp[4096], dst[4096];
    snprintf(tmp, sizeof tmp, "%s/.tmp.%s.%d", argv[1], argv[2], (int)getpid());
    snprintf(dst, sizeof dst, "%s/%s", argv[1], argv[2]);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) fail(tmp);
    if (write(fd, buf, n) != (ssize_t)n) fail("write");
    if (fsync(fd) < 0) fail("fsync");
    close(fd);
    if (rename(tmp, dst) < 0) fail("rename");
    fsync_dir(argv[1]);
    return 0;
}
