/* bench/floor/cpuid.c: what one `cpuid` takes on this machine (leaves 2 and 4, the ones
 * glibc's start-up asks over and over for the caches' sizes). On bare metal some tens of
 * nanoseconds; in a VM a trap to the hypervisor, microseconds. Prints microseconds. */
#include <cpuid.h>
#include <stdio.h>
#include <time.h>

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(void)
{
	enum { N = 2000 };
	unsigned a, b, c, d, sink = 0;
	double t0 = now_us();
	for (int i = 0; i < N; i++) {
		if (i % 2)
			__cpuid(2, a, b, c, d);
		else
			__cpuid_count(4, (i / 2) % 4, a, b, c, d);
		sink += a ^ b ^ c ^ d;
	}
	printf("%.2f\n", (now_us() - t0) / N + (sink & 0) * 1.0);
	return 0;
}
