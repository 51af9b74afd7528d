// Command mlp trains a small MLP data-parallel with autobyte: a 20 → 64
// (tanh) → 4 classifier of synthetic Gaussian blobs, plain SGD, gradients
// summed through parameter servers or ring all-reduce.
//
// The whole cluster in this process (servers and workers as goroutines on
// loopback):
//
//	go run ./examples/mlp --workers 4 --servers 2 --arch ps --iterations 200 --batch 16 --seed 1
//
// One process per server and worker (same flags everywhere, plus a role):
//
//	export AUTOBYTE_TOKEN=secret MASTER_ADDR=127.0.0.1 MASTER_PORT=29500
//	go run ./examples/mlp --role server --index 0 --workers 2 --servers 1 &
//	go run ./examples/mlp --role worker --rank 1 --workers 2 --servers 1 &
//	go run ./examples/mlp --role worker --rank 0 --workers 2 --servers 1
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/autobyte/autobyte/cluster"
	"github.com/autobyte/autobyte/job"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "mlp:", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	c := DefaultConfig()
	fs := flag.NewFlagSet("mlp", flag.ContinueOnError)
	fs.IntVar(&c.Workers, "workers", 4, "number of workers (default in a worker process: $WORLD_SIZE if set)")
	servers := fs.Int("servers", 2, "number of parameter servers (ignored with --arch allreduce)")
	arch := fs.String("arch", "ps", "gradient aggregation: ps or allreduce")
	fs.IntVar(&c.Iterations, "iterations", c.Iterations, "SGD steps")
	fs.IntVar(&c.Batch, "batch", c.Batch, "per-worker batch (the global batch is workers × batch)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the data, the permutation and the initial weights")
	lr := fs.Float64("lr", float64(c.LR), "SGD learning rate")
	fs.IntVar(&c.Hidden, "hidden", c.Hidden, "hidden units")
	every := fs.Int("every", 20, "print the training loss every this many iterations")
	scheduler := fs.String("scheduler", "priority", "communication scheduling: priority (ByteScheduler-style, small partitions) or fifo")
	role := fs.String("role", "", "empty: the whole cluster in this process; worker or server: this process only")
	rank := fs.Int("rank", 0, "this worker's rank (--role worker; default $RANK)")
	index := fs.Int("index", 0, "this server's index (--role server)")
	master := fs.String("master", "", "rendezvous address host:port, rank 0 listens there (default $MASTER_ADDR and $AUTOBYTE_MASTER_PORT, else $MASTER_PORT+1)")
	listen := fs.String("listen", "", "where a server or an all-reduce worker accepts connections (default: any interface, a free port)")
	token := fs.String("token", "", "shared cluster token (default $AUTOBYTE_TOKEN)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.LR = float32(*lr)

	cl := Cluster{Servers: *servers, Sched: DefaultSched}
	switch *arch {
	case "ps":
		cl.Arch = worker.PS
	case "allreduce":
		cl.Arch = worker.AllReduce
	default:
		return fmt.Errorf("--arch %q: want ps or allreduce", *arch)
	}
	switch *scheduler {
	case "priority":
	case "fifo":
		cl.Sched = sched.Config{}
	default:
		return fmt.Errorf("--scheduler %q: want priority or fifo", *scheduler)
	}

	if *role == "" {
		if err := c.Validate(); err != nil {
			return err
		}
		return inProcess(ctx, c, cl, *every, out)
	}

	// One process of a multi-process job: rendezvous from flags or the
	// usual launcher environment.
	env, err := cluster.FromEnv(cluster.Env{Rank: *rank, WorldSize: c.Workers})
	if err != nil {
		return err
	}
	if !set["rank"] {
		*rank = env.Rank
	}
	if !set["workers"] && env.WorldSize > 0 {
		c.Workers = env.WorldSize
	}
	if err := c.Validate(); err != nil {
		return err
	}
	n := job.Net{Master: *master, Listen: *listen, Token: *token, PeerTimeout: 5 * time.Second}
	if n.Master == "" {
		if env.MasterAddr == "" || env.Port == 0 {
			return cluster.ErrNoCoordinator
		}
		n.Master = net.JoinHostPort(env.MasterAddr, strconv.Itoa(env.Port))
	}
	if n.Token == "" {
		n.Token = os.Getenv("AUTOBYTE_TOKEN")
	}
	if n.Token == "" {
		return errors.New("no cluster token: pass --token or set AUTOBYTE_TOKEN (every process of the job needs the same one)")
	}
	switch *role {
	case "server":
		if cl.Arch != worker.PS {
			return errors.New("--role server needs --arch ps")
		}
		s, err := job.RunServer(ctx, cl.Spec(c), *index, n)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "server %d: done in %.2fs, %d bytes in, %d bytes out\n", *index, s.WallS, s.BytesReceived, s.BytesSent)
		return nil
	case "worker":
		train, test := MakeData(c)
		var rep Report
		if *rank == 0 {
			header(out, c, cl)
			rep = progress(out, train, *every)
		}
		m, err := RunWorker(ctx, c, cl, *rank, n, train, *every, rep)
		if err != nil {
			return err
		}
		_, acc := m.Evaluate(test)
		fmt.Fprintf(out, "worker %d: test accuracy %.1f%% (%d points)\n", *rank, 100*acc, test.Len())
		return nil
	}
	return fmt.Errorf("--role %q: want worker, server or nothing", *role)
}

func header(out io.Writer, c Config, cl Cluster) {
	how := fmt.Sprintf("%d parameter servers", cl.Servers)
	if cl.Arch == worker.AllReduce {
		how = "ring all-reduce"
	}
	fmt.Fprintf(out, "MLP %d→%d→%d, %d workers × batch %d (global batch %d), %s, SGD lr %g, %d iterations, seed %d\n",
		c.Inputs, c.Hidden, c.Classes, c.Workers, c.Batch, c.Workers*c.Batch, how, c.LR, c.Iterations, c.Seed)
}

// progress prints the loss over the whole training set.
func progress(out io.Writer, train *Dataset, every int) Report {
	return func(it int, m *MLP) {
		if (every <= 0 || it%every != 0) && it != m.cfg.Iterations {
			return
		}
		loss, acc := m.Evaluate(train)
		fmt.Fprintf(out, "iteration %4d  training loss %.4f  accuracy %5.1f%%\n", it, loss, 100*acc)
	}
}

func inProcess(ctx context.Context, c Config, cl Cluster, every int, out io.Writer) error {
	train, test := MakeData(c)
	header(out, c, cl)
	start := time.Now()
	models, err := RunInProcess(ctx, c, cl, train, every, progress(out, train, every))
	if err != nil {
		return err
	}
	d := time.Since(start)
	same := true
	for _, m := range models[1:] {
		for t := range numTensors {
			same = same && slices.Equal(m.Params[t], models[0].Params[t])
		}
	}
	_, trainAcc := models[0].Evaluate(train)
	_, testAcc := models[0].Evaluate(test)
	fmt.Fprintf(out, "final: training accuracy %.1f%%, test accuracy %.1f%% (%d points); %d replicas identical: %v; %.2fs\n",
		100*trainAcc, 100*testAcc, test.Len(), len(models), same, d.Seconds())
	if !same {
		return errors.New("the workers' replicas diverged")
	}
	return nil
}
