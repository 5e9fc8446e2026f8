/*
 * clockstep: an LD_PRELOAD library that moves a process's wall clock the way
 * an NTP step or a resumed VM does, and leaves its monotonic clocks alone.
 *
 * The offset, in nanoseconds (a little-endian int64), is the first 8 bytes
 * of the file that $REDSEM_CLOCK_FILE names; the library maps the file and
 * reads the offset on every call, so a test moves the clock with one atomic
 * store into its own mapping of the file (redistest.WallClock.Step), and the
 * next clock read sees it. Without the variable, or if the file cannot be
 * mapped, the clock is the system's.
 *
 * Shifted: clock_gettime of CLOCK_REALTIME, CLOCK_REALTIME_COARSE,
 * CLOCK_TAI and CLOCK_REALTIME_ALARM, gettimeofday and time: what Redis and
 * Valkey read for TIME, key expiry and script time. Not shifted:
 * CLOCK_MONOTONIC and the other clocks, which an NTP step does not move
 * either and which drive Redis's timers (serverCron, the event loop).
 *
 * The real clock is read with the clock_gettime system call, never through
 * dlsym: a lookup may allocate, and jemalloc, which Debian's redis-server
 * and valkey-server use, reads the clock while it initialises, so a library
 * that resolves the real function lazily (libfaketime 0.9.10) recurses into
 * itself and the server never starts.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const volatile int64_t *offset_ns;

__attribute__((constructor)) static void clockstep_init(void) {
	const char *path = getenv("REDSEM_CLOCK_FILE");
	if (path == NULL) {
		return;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		return;
	}
	void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (p != MAP_FAILED) {
		offset_ns = (const volatile int64_t *)p;
	}
}

static int is_wall(clockid_t id) {
	return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI ||
	       id == CLOCK_REALTIME_ALARM;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
	long r = syscall(SYS_clock_gettime, id, ts);
	if (r != 0 || offset_ns == NULL || !is_wall(id)) {
		return (int)r;
	}
	int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec +
	             __atomic_load_n(offset_ns, __ATOMIC_RELAXED);
	ts->tv_sec = ns / 1000000000;
	ts->tv_nsec = ns % 1000000000;
	return 0;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
	struct timespec ts;
	struct timeval *out = tv;
	(void)tz;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
		return -1;
	}
	if (out != NULL) {
		out->tv_sec = ts.tv_sec;
		out->tv_usec = ts.tv_nsec / 1000;
	}
	return 0;
}

time_t time(time_t *t) {
	struct timespec ts;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
		return (time_t)-1;
	}
	if (t != NULL) {
		*t = ts.tv_sec;
	}
	return ts.tv_sec;
}
