// The training thread's side of the engine, in C: ab_post queues a
// gradient and ab_wait_layer waits for a layer's sums without entering the
// Go runtime. A C thread that calls into Go keeps a Go processor (P) when
// it returns, so a training thread that posted every gradient through Go
// held one of the engine's processors while it computed, waited for one on
// each call when the engine's goroutines had them, and kept Go's system
// monitor polling; here the training thread takes a mutex, and the engine
// drains the queue on its own goroutine (woken through an eventfd) and
// reports opened layers back (abh_opened).
#ifndef AUTOBYTE_HANDOFF_H
#define AUTOBYTE_HANDOFF_H

#include <stdint.h>

// One queued gradient.
typedef struct {
	int32_t tensor, iteration;
	float *data;
	int64_t n;
} abh_post;

// The binding's calls (see main.go's package comment).
int ab_post(int tensor, int iteration, float *data, int64_t n);
int ab_wait_layer(int layer, int iteration);
// ab_wait_run is ab_wait_layer returning, on success, how many layers from
// layer on (at least 1) have their sums of iteration in place.
int ab_wait_run(int layer, int iteration);
int ab_last_error(char *buf, int n);

// The engine's side. abh_open starts a session's handoff for tensors of
// elems[t] elements in nlayers layers; it returns the eventfd the engine
// reads to learn that the queue is not empty, or -1 with the error set.
int abh_open(int ntensors, const int64_t *elems, int nlayers);
// abh_set_wait_limit bounds each ab_wait_layer/ab_wait_run to limit_ns
// nanoseconds (0: no bound); past it the wait fails, saying how long it
// waited for what.
void abh_set_wait_limit(int64_t limit_ns);
// abh_record_waits makes ab_wait_layer record its waits for the tuner.
int abh_record_waits(int on);
// abh_take moves up to max queued posts, oldest first, into out and
// returns how many.
int abh_take(abh_post *out, int max);
// abh_take_waits moves up to max recorded waits (pairs of
// CLOCK_MONOTONIC nanoseconds: from, to) into out and returns how many.
int abh_take_waits(int64_t *out, int max);
// abh_opened: layer's sums of iteration are in place.
void abh_opened(int layer, int iteration);
// abh_stop: the engine stopped; posts and waits fail with why from now on.
void abh_stop(const char *why);
// abh_close ends the session's handoff (after abh_stop; the engine closes
// the eventfd); calls fail with "no session" until the next abh_open.
void abh_close(void);
// abh_set_error sets the error ab_last_error returns.
void abh_set_error(const char *msg);
// abh_now is CLOCK_MONOTONIC in nanoseconds.
int64_t abh_now(void);

#endif
