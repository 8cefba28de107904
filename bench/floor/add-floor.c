/*
 * add-floor: times one ledger ADD against the floor (floor.c), side by side.
 *
 *   add-floor [-n ROUNDS] [-w WARMUP] -o OUT.tsv LEDGER STDIN NETNS FLOOR FLOORDIR [EXTRA]
 *
 * Every round spawns each variant once (posix_spawn, no shell), in an order rotated
 * by one per round, and waits for it:
 *   add        LEDGER as a CNI plugin: CNI_COMMAND=ADD, a new container ID every round
 *              (so a new key, as for every new pod), stdin from STDIN, CNI_NETNS=NETNS;
 *              nothing is deleted between rounds
 *   floor      FLOOR FLOORDIR f<round>
 *   EXTRA      (optional) "floor-lock-file": FLOOR --lock-file FLOORDIR l<round>;
 *              "floor-syscalls": FLOOR --syscalls FLOORDIR s<round>, stdin from STDIN,
 *              CNI_NETNS=NETNS (every system call of an ADD, nothing else); or the
 *              absolute path of a second ledger binary, timed as "add-alt" like "add"
 *              (e.g. an older build, to compare two builds in one run); ALT_STDIN and
 *              ALT_NETNS, when set, are its stdin and CNI_NETNS instead of STDIN, NETNS
 * stdout and stderr of each go to /dev/null. Output: one line per timed run,
 * "variant<TAB>round<TAB>wall_usec<TAB>maxrss_kib<TAB>cpu_usec" (cpu = user+sys of the
 * child, from wait4), the format of bench/stats.py.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Spawns argv with env and stdin; returns wall and CPU microseconds. Dies on failure. */
static void spawn_wait(char **argv, char **env, const char *in, double *wall, double *cpu,
                       long *rss) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, in ? in : "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    struct rusage ru;
    int status;
    double t0 = now_us();
    int err = posix_spawn(&pid, argv[0], &fa, NULL, argv, env);
    if (err) {
        fprintf(stderr, "add-floor: spawn %s: %s\n", argv[0], strerror(err));
        exit(1);
    }
    if (wait4(pid, &status, 0, &ru) < 0) {
        perror("wait4");
        exit(1);
    }
    *wall = now_us() - t0;
    posix_spawn_file_actions_destroy(&fa);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "add-floor: %s failed (status %d)\n", argv[0], status);
        exit(1);
    }
    *cpu = ru.ru_utime.tv_sec * 1e6 + ru.ru_utime.tv_usec + ru.ru_stime.tv_sec * 1e6 +
           ru.ru_stime.tv_usec;
    *rss = ru.ru_maxrss;
}

int main(int argc, char **argv) {
    int rounds = 300, warmup = 10, opt;
    const char *out = NULL;
    while ((opt = getopt(argc, argv, "n:w:o:")) != -1) {
        if (opt == 'n') rounds = atoi(optarg);
        else if (opt == 'w') warmup = atoi(optarg);
        else if (opt == 'o') out = optarg;
        else return 2;
    }
    if (!out || argc - optind < 5) {
        fprintf(stderr, "usage: add-floor [-n R] [-w W] -o OUT LEDGER STDIN NETNS FLOOR FLOORDIR [EXTRA]\n");
        return 2;
    }
    char **a = argv + optind;
    const char *ledger = a[0], *in = a[1], *netns = a[2], *floor = a[3], *fdir = a[4];
    const char *extra = argc - optind > 5 ? a[5] : NULL;
    int nv = extra ? 3 : 2;
    int alt = extra && extra[0] == '/';
    const char *names[3] = {"add", "floor", alt ? "add-alt" : extra};
    /* The second build may get its own stdin and netns: the same build twice then
     * measures one step of ADD (bench/add-floor.sh VARIANT=). */
    const char *alt_in = getenv("ALT_STDIN") ? getenv("ALT_STDIN") : in;
    const char *alt_netns = getenv("ALT_NETNS") ? getenv("ALT_NETNS") : netns;
    FILE *o = fopen(out, "w");
    if (!o) {
        perror(out);
        return 1;
    }
    char cid[64], fname[64], netns_env[4200], cid_env[100];
    for (int r = -warmup; r < rounds; r++) {
        for (int k = 0; k < nv; k++) {
            int v = ((r < 0 ? -r : r) + k) % nv; /* rotated by one per round */
            double wall, cpu;
            long rss;
            /* The round number tags every name; warmup rounds use negative ones. */
            if (v == 0 || (v == 2 && alt)) {
                snprintf(cid, sizeof cid, "%c%d-%d", v ? 'a' : 'k', (int)getpid(), r + warmup);
                snprintf(cid_env, sizeof cid_env, "CNI_CONTAINERID=%s", cid);
                snprintf(netns_env, sizeof netns_env, "CNI_NETNS=%s", v ? alt_netns : netns);
                char *env[] = {"CNI_COMMAND=ADD", cid_env, netns_env, "CNI_IFNAME=eth0",
                               "CNI_PATH=/usr/lib/cni", "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                               NULL};
                char *args[] = {(char *)(v ? extra : ledger), NULL};
                spawn_wait(args, env, v ? alt_in : in, &wall, &cpu, &rss);
            } else {
                snprintf(fname, sizeof fname, "%c%d-%d", v == 1 ? 'f' : 'l', (int)getpid(),
                         r + warmup);
                snprintf(netns_env, sizeof netns_env, "CNI_NETNS=%s", netns);
                int calls = v == 2 && !strcmp(extra, "floor-syscalls");
                char *env[] = {calls ? netns_env : NULL, NULL};
                char *plain[] = {(char *)floor, (char *)fdir, fname, NULL};
                char *third[] = {(char *)floor, calls ? "--syscalls" : "--lock-file", (char *)fdir,
                                 fname, NULL};
                spawn_wait(v == 1 ? plain : third, env, calls ? in : NULL, &wall, &cpu, &rss);
            }
            if (r >= 0) fprintf(o, "%s\t%d\t%.1f\t%ld\t%.1f\n", names[v], r, wall, rss, cpu);
        }
    }
    fclose(o);
    return 0;
}
