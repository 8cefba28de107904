/*
 * A process that keeps a network namespace alive without being in it, for tests/holders.rs
 * (issue 37): the namespace's path is removed afterwards, and only this process holds it.
 *
 *   holder socket NETNS   a UDP socket made inside NETNS; the process is back in its own
 *                         namespace, every namespace fd closed. Prints "ready INO", INO the
 *                         inode of the socket's namespace (SIOCGSKNS), then waits.
 *   holder thread NETNS   a second thread enters NETNS and waits; the leader exits
 *                         (pthread_exit), a zombie while that thread lives. Prints
 *                         "ready TID" (the thread's) once it is in.
 *
 * Killed by the test (SIGKILL to the PID ends every thread).
 *
 *   gcc -O2 -Wall -pthread -o holder holder.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *netns_path;

static void die(const char *what)
{
	fprintf(stderr, "holder: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* The calling thread enters the namespace at `path`; the fd is closed again. */
static void enter(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		die(path);
	if (setns(fd, CLONE_NEWNET) < 0)
		die("setns");
	close(fd);
}

static void wait_forever(void)
{
	for (;;)
		pause();
}

static int hold_by_socket(void)
{
	int own = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	if (own < 0)
		die("/proc/thread-self/ns/net");
	enter(netns_path);
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		die("socket");
	if (setns(own, CLONE_NEWNET) < 0)
		die("setns back");
	close(own);
	/* Which namespace the socket holds, for the test to check; the fd goes at once. */
	int ns = ioctl(s, SIOCGSKNS);
	if (ns < 0)
		die("SIOCGSKNS");
	struct stat st;
	if (fstat(ns, &st) < 0)
		die("fstat");
	close(ns);
	printf("ready %llu\n", (unsigned long long)st.st_ino);
	fflush(stdout);
	wait_forever();
	return 0;
}

static void *thread_main(void *arg)
{
	(void)arg;
	enter(netns_path);
	printf("ready %ld\n", (long)syscall(SYS_gettid));
	fflush(stdout);
	wait_forever();
	return NULL;
}

static int hold_by_thread(void)
{
	pthread_t t;
	int err = pthread_create(&t, NULL, thread_main, NULL);
	if (err) {
		errno = err;
		die("pthread_create");
	}
	/* The leader leaves; the process lives on in its thread. */
	pthread_exit(NULL);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: holder socket|thread NETNS\n");
		return 2;
	}
	netns_path = argv[2];
	if (strcmp(argv[1], "socket") == 0)
		return hold_by_socket();
	if (strcmp(argv[1], "thread") == 0)
		return hold_by_thread();
	fprintf(stderr, "holder: unknown mode %s\n", argv[1]);
	return 2;
}
