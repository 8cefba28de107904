/*
 * floor: what one durable ledger ADD cannot do without, as a program: exec, then one
 * small file made durable the way the ledger makes a record durable (temp file 0600,
 * write, fsync, rename over the name, fsync of the directory). Statically linked like
 * cni-ledger, so both pay the same exec.
 *
 *   floor DIR NAME [BYTES=650]           the floor
 *   floor --lock-file DIR NAME [BYTES]   the same plus one new empty file in DIR/locks
 *                                        (what a lock file per key costs an ADD)
 *   floor --syscalls DIR NAME [BYTES]    every system call the ledger's ADD makes, in its
 *                                        order, and nothing else (see syscalls() below)
 *   floor --steps DIR NAME [BYTES]       as --syscalls, and prints to stderr what each
 *                                        step took ("step<TAB>usec"), the clock read
 *                                        between steps only in this mode
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

static void fail(const char *what) {
    perror(what);
    exit(1);
}

/*
 * The system calls of a ledger ADD with its conflist remembered (strace of
 * src/plugin/add.rs, 2026-12-06), made with the same arguments where they matter and
 * with none of the work between them: what an ADD that keeps everything the record
 * holds costs in system calls alone. Before the durable write (done by main, into
 * DIR/records): stdin read to its end; the ledger's two directories checked; the key's
 * byte lock on DIR/locks/keys; the boot ID; the namespace's identity (statfs, open,
 * fstat, its cookie); the snapshot sweep's shared lock; the conflist memo (DIR/memo)
 * read and four identities checked; the temp file's pid. After: the two locks closed
 * and the result written to stdout. Returns the lock descriptors.
 */
#define NS_GET_COOKIE _IOR(0xb7, 0xd, unsigned long long)

/* --steps: the time since the previous step, printed with the step's name. */
static int steps;
static struct timespec mark;
static void step(const char *what) {
    if (!steps) return;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (what)
        fprintf(stderr, "%s\t%.2f\n", what,
                (t.tv_sec - mark.tv_sec) * 1e6 + (t.tv_nsec - mark.tv_nsec) / 1e3);
    mark = t;
}

static void syscalls(const char *dir, const char *name, int fds[2]) {
    char in[8192], p[4096], id[128], memo[8192];
    struct statx sx;
    if (steps) {
        /* Its stack faulted in before the first step, not charged to one. */
        memset(in, 0, sizeof in);
        memset(memo, 0, sizeof memo);
        memset(p, 0, sizeof p);
        step(NULL);
    }
    while (read(0, in, sizeof in) > 0) {
    }
    step("stdin");
    if (steps) {
        /* A process's first path lookup costs ~8 us more than later ones, whatever the
         * path: charged here, where the floor's first open pays it too. */
        statx(AT_FDCWD, "/", 0, STATX_ALL, &sx);
        step("first path lookup (the floor's)");
    }
    snprintf(p, sizeof p, "%s/records", dir);
    statx(AT_FDCWD, p, 0, STATX_ALL, &sx);
    snprintf(p, sizeof p, "%s/locks", dir);
    statx(AT_FDCWD, p, 0, STATX_ALL, &sx);
    step("ledger dirs");
    snprintf(p, sizeof p, "%s/locks/keys", dir);
    fds[0] = open(p, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    unsigned long long h = 1469598103934665603ULL;
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = h >> 2, .l_len = 1};
    if (fds[0] < 0 || fcntl(fds[0], F_OFD_SETLK, &fl) < 0) fail(p);
    step("key lock");
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, id, sizeof id) <= 0) fail("boot_id");
    close(fd);
    step("boot id");
    const char *ns = getenv("CNI_NETNS");
    struct statfs sf;
    if (!ns || statfs(ns, &sf) < 0) fail("CNI_NETNS");
    fd = open(ns, O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    unsigned long long cookie;
    if (fd < 0 || statx(fd, "", AT_EMPTY_PATH, STATX_ALL, &sx) < 0) fail(ns);
    ioctl(fd, NS_GET_COOKIE, &cookie);
    close(fd);
    step("netns identity");
    snprintf(p, sizeof p, "%s/locks/.snapshots", dir);
    fds[1] = open(p, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fds[1] < 0 || flock(fds[1], LOCK_SH) < 0) fail(p);
    step("snapshot lock");
    snprintf(p, sizeof p, "%s/memo", dir);
    fd = open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) fail(p);
    while (read(fd, memo, sizeof memo) > 0) {
    }
    close(fd);
    step("memo read");
    statx(AT_FDCWD, dir, 0, STATX_ALL, &sx);
    statx(AT_FDCWD, p, 0, STATX_ALL, &sx);
    snprintf(p, sizeof p, "%s/absent", dir);
    statx(AT_FDCWD, p, AT_SYMLINK_NOFOLLOW, STATX_ALL, &sx);
    snprintf(p, sizeof p, "%s/locks/keys", dir);
    statx(AT_FDCWD, p, AT_SYMLINK_NOFOLLOW, STATX_ALL, &sx);
    step("memo identities");
    getpid();
}

int main(int argc, char **argv) {
    int lock_file = argc > 1 && !strcmp(argv[1], "--lock-file");
    steps = argc > 1 && !strcmp(argv[1], "--steps");
    int as_ledger = argc > 1 && (!strcmp(argv[1], "--syscalls") || steps);
    if (lock_file || as_ledger) {
        argv++;
        argc--;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: floor [--lock-file|--syscalls|--steps] DIR NAME [BYTES]\n");
        return 2;
    }
    const char *dir = argv[1], *name = argv[2];
    int locks[2] = {-1, -1};
    char records[1024];
    if (as_ledger) {
        syscalls(dir, name, locks);
        snprintf(records, sizeof records, "%s/records", dir);
        dir = records;
    }
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
    step("durable write (the floor's)");
    if (as_ledger) {
        close(d);
        close(locks[1]);
        close(locks[0]);
        static const char result[] = "{\"cniVersion\":\"1.0.0\",\"dns\":{}}\n";
        if (write(1, result, sizeof result - 1) < 0) fail("stdout");
        step("locks closed, stdout");
    }
    return 0;
}
