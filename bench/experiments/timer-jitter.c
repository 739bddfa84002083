/*
 * How late a thread that sleeps 100 µs wakes up on this machine (timer slack 1 ns): the floor
 * under every latency a sleeping server or client can show, which on a shared VM decides
 * whether a sub-millisecond P99.99 is possible at all (docs/queue-sets.md).
 *
 *   cc -O2 bench/experiments/timer-jitter.c -o /tmp/timer-jitter && /tmp/timer-jitter 30000
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

static long now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 30000;
	if (n < 10000 || n > 10000000) {
		fprintf(stderr, "usage: timer-jitter [SLEEPS, 10000 to 10000000]\n");
		return 2;
	}
	long *late = malloc(n * sizeof(long));
	if (!late)
		return 1;
	prctl(PR_SET_TIMERSLACK, 1);
	struct timespec d = { 0, 100000 };
	for (int i = 0; i < n; i++) {
		long t = now_ns();
		nanosleep(&d, 0);
		late[i] = now_ns() - t - 100000;
	}
	qsort(late, n, sizeof(long), cmp);
	printf("{\"bench\": \"timer_jitter\", \"sleeps\": %d, \"sleep_us\": 100, \"late_p50_us\": %.1f, \"late_p99_us\": %.1f, "
	       "\"late_p999_us\": %.1f, \"late_p9999_us\": %.1f, \"late_max_us\": %.1f}\n",
	       n, late[n / 2] / 1e3, late[(long)n * 99 / 100] / 1e3, late[(long)n * 999 / 1000] / 1e3,
	       late[(long)n * 9999 / 10000] / 1e3, late[n - 1] / 1e3);
	free(late);
	return 0;
}
