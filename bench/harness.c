/*
 * harness: times exec'd commands round-robin, side by side, for bench/run.sh.
 *
 *   harness -n RUNS [-w WARMUP] [-o SAMPLES.tsv] SPECFILE
 *
 * SPECFILE describes variants, one directive per line (blank lines and # ignored):
 *
 *   variant NAME          starts a variant
 *   arg ARG               argv of the timed command (first = program, absolute path)
 *   env K=V               added to (or replacing in) the inherited environment
 *   stdin FILE            stdin of the timed command (default /dev/null)
 *   post-arg / post-env / post-stdin
 *                         an untimed command run right after each timed one
 *                         (e.g. DEL after ADD, so every iteration starts alike)
 *
 * "{i}" in any arg/env value is replaced by the iteration number, so every run can
 * use a fresh container ID. Each round runs every variant once, in an order rotated by
 * one per round, so no variant always follows the same neighbour. Warmup rounds are
 * run but not recorded. A non-zero exit of any command aborts with its output.
 *
 * Output: SAMPLES.tsv gets "variant<TAB>round<TAB>wall_usec<TAB>maxrss_kib<TAB>cpu_usec" per
 * timed run (from wait4's rusage: maxrss is what `/usr/bin/time -v` calls "Maximum
 * resident set size"; cpu is user+sys of the child).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define MAXV 16
#define MAXA 64

struct cmd {
    char *argv[MAXA];
    int argc;
    char *env[MAXA];
    int envc;
    char *stdin_path;
};

struct variant {
    char *name;
    struct cmd run, post;
    int has_post;
};

static struct variant vs[MAXV];
static int nv;

static void die(const char *fmt, const char *a) {
    fprintf(stderr, "harness: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n");
    exit(2);
}

static char *subst(const char *s, long i) {
    char num[32];
    snprintf(num, sizeof num, "%ld", i);
    size_t cap = strlen(s) + 1, n = 0;
    for (const char *p = s; (p = strstr(p, "{i}")); p += 3) cap += strlen(num);
    char *out = malloc(cap);
    for (const char *p = s; *p;) {
        if (!strncmp(p, "{i}", 3)) {
            memcpy(out + n, num, strlen(num));
            n += strlen(num);
            p += 3;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = 0;
    return out;
}

/* environ with overrides; strings are leaked (a few hundred per run, fine). */
static char **make_env(struct cmd *c, long i) {
    int base = 0;
    while (environ[base]) base++;
    char **e = calloc(base + c->envc + 1, sizeof *e);
    int n = 0;
    for (int k = 0; k < base; k++) {
        int overridden = 0;
        for (int j = 0; j < c->envc; j++) {
            size_t kl = strchr(c->env[j], '=') - c->env[j];
            if (!strncmp(environ[k], c->env[j], kl + 1)) overridden = 1;
        }
        if (!overridden) e[n++] = environ[k];
    }
    for (int j = 0; j < c->envc; j++) e[n++] = subst(c->env[j], i);
    e[n] = NULL;
    return e;
}

static const char *outpath = "/dev/shm/bench-harness.out";

/* Returns elapsed usec; *rss gets maxrss (KiB). Aborts on failure. */
static double run(struct cmd *c, long i, long *rss, double *cpu, const char *what) {
    char *argv[MAXA + 1];
    for (int k = 0; k < c->argc; k++) argv[k] = subst(c->argv[k], i);
    argv[c->argc] = NULL;
    char **env = make_env(c, i);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, c->stdin_path ? c->stdin_path : "/dev/null",
                                     O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, outpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    struct timespec t0, t1;
    pid_t pid;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int err = posix_spawn(&pid, argv[0], &fa, NULL, argv, env);
    if (err) {
        errno = err;
        perror(argv[0]);
        exit(2);
    }
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) {
        perror("wait4");
        exit(2);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    posix_spawn_file_actions_destroy(&fa);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "harness: %s command %s failed (status 0x%x, iteration %ld); output:\n",
                what, argv[0], status, i);
        FILE *f = fopen(outpath, "r");
        char buf[4096];
        size_t n;
        while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stderr);
        exit(3);
    }
    for (int k = 0; k < c->argc; k++) free(argv[k]);
    if (rss) *rss = ru.ru_maxrss;
    if (cpu)
        *cpu = (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
    return (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
}

static void parse(const char *file) {
    FILE *f = fopen(file, "r");
    if (!f) die("cannot open spec %s", file);
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (!*p || *p == '#') continue;
        char *sp = strchr(p, ' ');
        if (!sp) die("bad spec line: %s", p);
        *sp = 0;
        char *val = strdup(sp + 1);
        if (!strcmp(p, "variant")) {
            if (nv == MAXV) die("too many variants%s", "");
            vs[nv++].name = val;
            continue;
        }
        if (!nv) die("directive before any variant: %s", p);
        struct variant *v = &vs[nv - 1];
        struct cmd *c = &v->run;
        if (!strncmp(p, "post-", 5)) {
            c = &v->post;
            v->has_post = 1;
            p += 5;
        }
        if (!strcmp(p, "arg")) {
            if (c->argc == MAXA) die("too many args%s", "");
            c->argv[c->argc++] = val;
        } else if (!strcmp(p, "env")) {
            if (c->envc == MAXA || !strchr(val, '=')) die("bad env %s", val);
            c->env[c->envc++] = val;
        } else if (!strcmp(p, "stdin")) {
            c->stdin_path = val;
        } else {
            die("unknown directive %s", p);
        }
    }
    fclose(f);
    for (int k = 0; k < nv; k++) {
        if (!vs[k].run.argc) die("variant %s has no command", vs[k].name);
        if (vs[k].has_post && !vs[k].post.argc) die("variant %s: post without post-arg", vs[k].name);
    }
}

int main(int argc, char **argv) {
    long runs = 20, warmup = 3;
    const char *samples = NULL;
    int opt;
    while ((opt = getopt(argc, argv, "n:w:o:")) != -1) {
        switch (opt) {
        case 'n': runs = atol(optarg); break;
        case 'w': warmup = atol(optarg); break;
        case 'o': samples = optarg; break;
        default: die("usage: harness -n RUNS [-w WARMUP] [-o SAMPLES.tsv] SPECFILE%s", "");
        }
    }
    if (optind != argc - 1) die("usage: harness -n RUNS [-w WARMUP] [-o SAMPLES.tsv] SPECFILE%s", "");
    parse(argv[optind]);
    char tmp[64];
    snprintf(tmp, sizeof tmp, "/dev/shm/bench-harness.%d.out", (int)getpid());
    outpath = strdup(tmp);
    FILE *out = samples ? fopen(samples, "w") : stdout;
    if (!out) die("cannot write %s", samples);
    long iter = 0;
    for (long r = 0; r < warmup + runs; r++) {
        for (int k = 0; k < nv; k++) {
            struct variant *v = &vs[(k + r) % nv];
            long i = iter++;
            long rss = 0;
            double cpu = 0;
            double us = run(&v->run, i, &rss, &cpu, "timed");
            if (v->has_post) run(&v->post, i, NULL, NULL, "post");
            if (r >= warmup)
                fprintf(out, "%s\t%ld\t%.1f\t%ld\t%.0f\n", v->name, r - warmup, us, rss, cpu);
        }
    }
    if (samples) fclose(out);
    unlink(outpath);
    return 0;
}
