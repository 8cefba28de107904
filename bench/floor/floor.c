/*
 * floor: what one durable ledger ADD cannot do without, as a program: exec, then one
 * small file made durable the way the ledger makes a record durable (temp file 0600,
 * write, fsync, rename over the name, fsync of the directory). Statically linked like
 * cni-ledger, so both pay the same exec.
 *
 *   floor DIR NAME [BYTES=650]           the floor
 *   floor --lock-file DIR NAME [BYTES]   the same plus one new empty file in DIR/locks
 *                                        (what a lock file per key costs an ADD)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

static void fail(const char *what) {
    perror(what);
    exit(1);
}

int main(int argc, char **argv) {
    int lock_file = argc > 1 && !strcmp(argv[1], "--lock-file");
    if (lock_file) {
        argv++;
        argc--;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: floor [--lock-file] DIR NAME [BYTES]\n");
        return 2;
    }
    const char *dir = argv[1], *name = argv[2];
    size_t n = argc > 3 ? (size_t)atol(argv[3]) : 650;
    char tmp[4096], dst[4096], lock[4096];
    if (lock_file) {
        snprintf(lock, sizeof lock, "%s/locks/%s.lock", dir, name);
        int l = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (l < 0 || flock(l, LOCK_EX | LOCK_NB) < 0) fail(lock);
    }
    char *buf = malloc(n ? n : 1);
    memset(buf, 'x', n);
    snprintf(tmp, sizeof tmp, "%s/.tmp.%s.%d", dir, name, (int)getpid());
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) fail(tmp);
    if (write(fd, buf, n) != (ssize_t)n) fail("write");
    if (fsync(fd) < 0) fail("fsync");
    if (rename(tmp, dst) < 0) fail("rename");
    close(fd);
    int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d < 0 || fsync(d) < 0) fail(dir);
    return 0;
}
