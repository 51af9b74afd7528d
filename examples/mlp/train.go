package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/job"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/worker"
)

// Engine is what training needs of autobyte: *job.Worker has both methods.
type Engine interface {
	// Post hands over a gradient; the engine overwrites it in place with
	// the sum over all workers.
	Post(tensor, iteration int, grad []float32) error
	// WaitLayer blocks until every tensor of layer of iteration is summed.
	WaitLayer(layer, iteration int) error
}

// Report is called by rank 0 whenever its parameters are those after it
// SGD steps: at it = 0, every, 2·every, … and at the end.
type Report func(it int, m *MLP)

// TrainWorker trains rank's replica data-parallel through e and returns
// its parameters after c.Iterations steps (the same on every rank).
//
// Iteration it: for each layer l in forward order, wait for layer l's
// summed gradients of iteration it-1 (WaitLayer(l, it-1)), apply SGD to
// that layer only, and run its forward; layer 1 thus waits for nothing but
// its own gate while layer 0 is already computing. Backward then produces
// layer 1's gradients first and posts them at once, then layer 0's.
func TrainWorker(e Engine, c Config, rank int, train *Dataset, every int, report Report) (*MLP, error) {
	m := NewMLP(c)
	grads := m.NewGrads()
	b := m.NewBatch(c.Batch)
	perm := order(c)
	var idx []int
	for it := range c.Iterations {
		idx = shard(c, perm, it, rank, idx)
		b.Load(train, idx)
		for l := range numLayers {
			if it > 0 {
				// The per-layer gate: layer l of the previous iteration, nothing else.
				if err := e.WaitLayer(l, it-1); err != nil {
					return nil, err
				}
				// grads of layer l now hold sums of the workers' local means:
				// dividing by Workers gives the mean over the global batch.
				m.Step(l, &grads, c.Workers)
			}
			m.Forward(l, b)
		}
		if report != nil && every > 0 && it%every == 0 {
			report(it, m)
		}
		var perr error
		m.Backward(b, &grads, func(l int) {
			for _, t := range layerTensors[l] {
				if err := e.Post(t, it, grads[t]); err != nil && perr == nil {
					perr = err
				}
			}
		})
		if perr != nil {
			return nil, perr
		}
	}
	// The last iteration's sums.
	for l := range numLayers {
		if err := e.WaitLayer(l, c.Iterations-1); err != nil {
			return nil, err
		}
		m.Step(l, &grads, c.Workers)
	}
	if report != nil {
		report(c.Iterations, m)
	}
	return m, nil
}

// Cluster is the autobyte side of a job.
type Cluster struct {
	Arch    worker.Arch
	Servers int
	Sched   sched.Config
}

// DefaultSched is ByteScheduler-style priority scheduling with small
// partitions, so even this model's tensors are split into pieces.
var DefaultSched = sched.Config{PartitionBytes: 2048, CreditBytes: 8192, Order: sched.OrderPriority}

// Spec is the autobyte job for c.
func (cl Cluster) Spec(c Config) job.Spec {
	servers := cl.Servers
	if cl.Arch == worker.AllReduce {
		servers = 0
	}
	return job.Spec{Profile: c.Profile(), Arch: cl.Arch, Workers: c.Workers, Servers: servers,
		Sched: cl.Sched, Iterations: c.Iterations}
}

// RunWorker joins the job as rank, trains, and leaves it.
func RunWorker(ctx context.Context, c Config, cl Cluster, rank int, n job.Net, train *Dataset, every int, report Report) (*MLP, error) {
	w, err := job.Connect(ctx, cl.Spec(c), rank, n, nil)
	if err != nil {
		return nil, err
	}
	m, err := TrainWorker(w, c, rank, train, every, report)
	if err != nil && w.Err() != nil {
		err = w.Err() // the engine's reason (a lost peer) rather than its consequence
	}
	w.Close(err)
	return m, err
}

// RunInProcess runs the whole cluster (servers and workers) as goroutines
// on loopback with a fresh token, and returns every worker's model.
func RunInProcess(ctx context.Context, c Config, cl Cluster, train *Dataset, every int, report Report) ([]*MLP, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	spec := cl.Spec(c)
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	master, err := freeLoopback()
	if err != nil {
		return nil, err
	}
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	n := job.Net{Master: master, Listen: "127.0.0.1:0", Token: hex.EncodeToString(tok), PeerTimeout: 5 * time.Second}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	record := func(err error) {
		if err == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
		cancel() // one failure ends the job for everyone
	}
	for s := range spec.Servers {
		wg.Go(func() {
			_, err := job.RunServer(ctx, spec, s, n)
			record(err)
		})
	}
	models := make([]*MLP, c.Workers)
	for r := range c.Workers {
		wg.Go(func() {
			var rep Report
			if r == 0 {
				rep = report
			}
			m, err := RunWorker(ctx, c, cl, r, n, train, every, rep)
			models[r] = m
			record(err)
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, fmt.Errorf("mlp: %w", errors.Join(errs...))
	}
	return models, nil
}

// freeLoopback is a loopback address with a port that was free just now.
func freeLoopback() (string, error) {
	port, err := cluster.FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}
