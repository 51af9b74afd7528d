// See handoff.h.
#include "handoff.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define HIDDEN __attribute__((visibility("hidden")))

// Recorded waits kept for the tuner between two of its reads; older ones
// are dropped beyond this (the tuner reads them at every step).
#define MAX_WAITS 65536

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t opened = PTHREAD_COND_INITIALIZER;
static char last_error[1024];

static struct {
	int open;    // a session is open
	int stopped; // the engine stopped: stop_why says why
	char stop_why[1024];
	int ntensors, nlayers;
	int64_t *elems;  // elems[t]: tensor t's element count
	int64_t *synced; // synced[l]: the last iteration whose layer l is in place
	abh_post *queue; // queued posts, queue[0] oldest
	int queued, cap;
	int wake_fd; // eventfd the engine reads; written when the queue stops being empty
	int record_waits;
	int64_t wait_limit; // nanoseconds a wait may last; 0: no bound
	int64_t *waits;     // pairs (from, to)
	int nwaits;
} h = {.wake_fd = -1};

static void set_error_locked(const char *format, ...) {
	va_list ap;
	va_start(ap, format);
	vsnprintf(last_error, sizeof last_error, format, ap);
	va_end(ap);
}

static const char no_session[] = "libautobyte: no session (call ab_open first, or the session was closed)";

HIDDEN int64_t abh_now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int ab_post(int tensor, int iteration, float *data, int64_t n) {
	pthread_mutex_lock(&mu);
	int rc = -1;
	if (!h.open) {
		set_error_locked("%s", no_session);
	} else if (h.stopped) {
		set_error_locked("%s", h.stop_why);
	} else if (tensor < 0 || tensor >= h.ntensors) {
		set_error_locked("libautobyte: ab_post: tensor %d out of range (have %d)", tensor, h.ntensors);
	} else if (iteration < 0) {
		set_error_locked("libautobyte: ab_post: tensor %d: iteration %d < 0", tensor, iteration);
	} else if (data == NULL) {
		set_error_locked("libautobyte: ab_post: tensor %d: no data", tensor);
	} else if (n != h.elems[tensor]) {
		set_error_locked("libautobyte: ab_post: tensor %d: gradient has %lld elements, want %lld", tensor,
		                 (long long)n, (long long)h.elems[tensor]);
	} else {
		if (h.queued == h.cap) {
			int cap = h.cap ? 2 * h.cap : 64;
			abh_post *q = realloc(h.queue, (size_t)cap * sizeof *q);
			if (q == NULL) {
				set_error_locked("libautobyte: ab_post: tensor %d: out of memory queueing %d posts", tensor, cap);
				pthread_mutex_unlock(&mu);
				return -1;
			}
			h.queue = q;
			h.cap = cap;
		}
		h.queue[h.queued++] = (abh_post){.tensor = tensor, .iteration = iteration, .data = data, .n = n};
		rc = 0;
		if (h.queued == 1) {
			// The engine drains the whole queue after each read of the
			// eventfd, so only the first post into an empty queue wakes it.
			uint64_t one = 1;
			if (write(h.wake_fd, &one, sizeof one) != sizeof one && errno != EAGAIN) {
				set_error_locked("libautobyte: ab_post: waking the engine: %s", strerror(errno));
				h.queued--;
				rc = -1;
			}
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

int ab_wait_run(int layer, int iteration) {
	pthread_mutex_lock(&mu);
	int rc = -1;
	if (!h.open) {
		set_error_locked("%s", no_session);
	} else if (layer < 0 || layer >= h.nlayers) {
		set_error_locked("libautobyte: ab_wait_layer: layer %d out of range (have %d)", layer, h.nlayers);
	} else {
		int64_t from = 0;
		int waited = 0, timed_out = 0;
		struct timespec deadline;
		while (h.open && h.synced[layer] < iteration && !h.stopped) {
			if (!waited) {
				from = abh_now();
				// The condition variable's clock is CLOCK_REALTIME.
				clock_gettime(CLOCK_REALTIME, &deadline);
				deadline.tv_sec += h.wait_limit / 1000000000;
				deadline.tv_nsec += h.wait_limit % 1000000000;
				if (deadline.tv_nsec >= 1000000000) {
					deadline.tv_sec++;
					deadline.tv_nsec -= 1000000000;
				}
			}
			waited = 1;
			if (h.wait_limit <= 0) {
				pthread_cond_wait(&opened, &mu);
			} else if (pthread_cond_timedwait(&opened, &mu, &deadline) == ETIMEDOUT &&
			           h.open && h.synced[layer] < iteration && !h.stopped) {
				timed_out = 1;
				break;
			}
		}
		if (!h.open) {
			set_error_locked("%s", no_session);
		} else if (h.synced[layer] >= iteration) {
			rc = 1;
			while (layer + rc < h.nlayers && h.synced[layer + rc] >= iteration)
				rc++;
		} else if (timed_out) {
			set_error_locked("libautobyte: waited %.1f s for the sums of layer %d of iteration %d (the last in place: %lld): "
			                 "a worker has not posted its gradients of that iteration (is one stuck, or slower to reach it "
			                 "by that much?); AUTOBYTE_TIMEOUT (autobyte.torch.init(timeout=...)) sets how long to wait, 0 for ever",
			                 (double)(abh_now() - from) / 1e9, layer, iteration, (long long)h.synced[layer]);
		} else {
			set_error_locked("%s", h.stop_why);
		}
		if (waited && h.open && h.record_waits && h.nwaits < MAX_WAITS) {
			h.waits[2 * h.nwaits] = from;
			h.waits[2 * h.nwaits + 1] = abh_now();
			h.nwaits++;
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

int ab_wait_layer(int layer, int iteration) {
	return ab_wait_run(layer, iteration) < 0 ? -1 : 0;
}

int ab_last_error(char *buf, int n) {
	pthread_mutex_lock(&mu);
	int len = (int)strlen(last_error);
	if (buf != NULL && n > 0)
		snprintf(buf, (size_t)n, "%s", last_error);
	pthread_mutex_unlock(&mu);
	return len;
}

HIDDEN void abh_set_error(const char *msg) {
	pthread_mutex_lock(&mu);
	set_error_locked("%s", msg);
	pthread_mutex_unlock(&mu);
}

// free_locked frees the session's state; the eventfd is the engine's to
// close once abh_open returned it.
static void free_locked(void) {
	free(h.elems);
	free(h.synced);
	free(h.queue);
	free(h.waits);
	h.elems = h.synced = h.waits = NULL;
	h.queue = NULL;
	h.queued = h.cap = h.nwaits = 0;
	h.wake_fd = -1;
}

HIDDEN void abh_set_wait_limit(int64_t limit_ns) {
	pthread_mutex_lock(&mu);
	h.wait_limit = limit_ns > 0 ? limit_ns : 0;
	pthread_mutex_unlock(&mu);
}

HIDDEN int abh_record_waits(int on) {
	pthread_mutex_lock(&mu);
	int rc = 0;
	if (on && h.waits == NULL && (h.waits = malloc(2 * MAX_WAITS * sizeof *h.waits)) == NULL)
		rc = -1;
	else
		h.record_waits = on;
	pthread_mutex_unlock(&mu);
	return rc;
}

HIDDEN int abh_open(int ntensors, const int64_t *elems, int nlayers) {
	pthread_mutex_lock(&mu);
	if (h.open) {
		set_error_locked("libautobyte: a session is already open in this process");
		pthread_mutex_unlock(&mu);
		return -1;
	}
	free_locked();
	h.stopped = 0;
	h.ntensors = ntensors;
	h.nlayers = nlayers;
	h.record_waits = 0;
	h.wait_limit = 0;
	h.elems = malloc((size_t)(ntensors > 0 ? ntensors : 1) * sizeof *h.elems);
	h.synced = malloc((size_t)(nlayers > 0 ? nlayers : 1) * sizeof *h.synced);
	h.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (h.elems == NULL || h.synced == NULL || h.wake_fd < 0) {
		set_error_locked("libautobyte: ab_open: %s", h.wake_fd < 0 ? strerror(errno) : "out of memory");
		if (h.wake_fd >= 0)
			close(h.wake_fd);
		free_locked();
		pthread_mutex_unlock(&mu);
		return -1;
	}
	memcpy(h.elems, elems, (size_t)ntensors * sizeof *h.elems);
	for (int l = 0; l < nlayers; l++)
		h.synced[l] = -1;
	h.open = 1;
	int fd = h.wake_fd;
	pthread_mutex_unlock(&mu);
	return fd;
}

// take_locked moves up to max of the *count items of size bytes at from
// into out, oldest first, and returns how many.
static int take_locked(void *out, void *from, int *count, int max, size_t size) {
	int n = *count < max ? *count : max;
	if (n > 0) {
		memcpy(out, from, (size_t)n * size);
		memmove(from, (char *)from + (size_t)n * size, (size_t)(*count - n) * size);
		*count -= n;
	}
	return n;
}

HIDDEN int abh_take(abh_post *out, int max) {
	pthread_mutex_lock(&mu);
	int n = take_locked(out, h.queue, &h.queued, max, sizeof *h.queue);
	pthread_mutex_unlock(&mu);
	return n;
}

HIDDEN int abh_take_waits(int64_t *out, int max) {
	pthread_mutex_lock(&mu);
	int n = take_locked(out, h.waits, &h.nwaits, max, 2 * sizeof *h.waits);
	pthread_mutex_unlock(&mu);
	return n;
}

HIDDEN void abh_opened(int layer, int iteration) {
	pthread_mutex_lock(&mu);
	if (h.open && layer >= 0 && layer < h.nlayers && h.synced[layer] < iteration) {
		h.synced[layer] = iteration;
		pthread_cond_broadcast(&opened);
	}
	pthread_mutex_unlock(&mu);
}

HIDDEN void abh_stop(const char *why) {
	pthread_mutex_lock(&mu);
	if (h.open && !h.stopped) {
		h.stopped = 1;
		snprintf(h.stop_why, sizeof h.stop_why, "%s", why);
		pthread_cond_broadcast(&opened);
	}
	pthread_mutex_unlock(&mu);
}

HIDDEN void abh_close(void) {
	pthread_mutex_lock(&mu);
	h.open = 0;
	free_locked();
	pthread_cond_broadcast(&opened);
	pthread_mutex_unlock(&mu);
}
