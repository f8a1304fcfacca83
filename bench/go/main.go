// Command busbench is the Go baseline of the bus benchmark: one JetStream publisher and one
// durable pull consumer on the official client, measuring what the client can reach.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

type result struct {
	Events       int     `json:"events"`
	EventsPerSec float64 `json:"events_per_sec"`
	CPUMicros    float64 `json:"cpu_us_per_event"`
	P50Micros    float64 `json:"p50_us"`
	P99Micros    float64 `json:"p99_us"`
}

func main() {
	url := flag.String("url", nats.DefaultURL, "NATS URL")
	stream := flag.String("stream", "BENCH_GO", "stream to use (created by the harness)")
	subject := flag.String("subject", "bench.go.events", "subject to publish on")
	n := flag.Int("n", 50000, "events for the throughput run")
	latencyN := flag.Int("latency-n", 2000, "events for the latency run")
	payloadFile := flag.String("payload", "", "file holding the event payload")
	headersFile := flag.String("headers", "", "JSON object of the headers every message carries")
	flag.Parse()

	payload, err := os.ReadFile(*payloadFile)
	check(err)
	headers := map[string]string{}
	if *headersFile != "" {
		raw, err := os.ReadFile(*headersFile)
		check(err)
		check(json.Unmarshal(raw, &headers))
	}
	nc, err := nats.Connect(*url)
	check(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	check(err)
	ctx := context.Background()

	throughput := run(ctx, js, *stream, *subject, "tput", payload, headers, *n, false)
	latency := run(ctx, js, *stream, *subject, "lat", payload, headers, *latencyN, true)
	out := result{
		Events:       *n,
		EventsPerSec: throughput.EventsPerSec,
		CPUMicros:    throughput.CPUMicros,
		P50Micros:    latency.P50Micros,
		P99Micros:    latency.P99Micros,
	}
	check(json.NewEncoder(os.Stdout).Encode(out))
}

// run publishes n events and consumes them with a durable consumer. With sequential set,
// each publish waits for the previous event to be handled, so the figures are latencies.
// Every message carries headers (the msg id and ce-id unique to it), as the framework's do.
func run(ctx context.Context, js jetstream.JetStream, stream, subject, name string,
	payload []byte, headers map[string]string, n int, sequential bool) result {
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable:       "go-" + name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		FilterSubject: subject + "." + name,
		MaxAckPending: 20000,
	})
	check(err)
	sent := make([]time.Time, n)
	latencies := make([]time.Duration, 0, n)
	var handled atomic.Int64
	done := make(chan struct{})
	next := make(chan struct{}, 1)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		seq, _ := strconv.Atoi(msg.Headers().Get("Bench-Seq"))
		latencies = append(latencies, time.Since(sent[seq]))
		check(msg.Ack())
		if handled.Add(1) == int64(n) {
			close(done)
		}
		if sequential {
			next <- struct{}{}
		}
	}, jetstream.PullMaxMessages(1000))
	check(err)
	defer cc.Stop()

	cpuStart := cpuTime()
	start := time.Now()
	for i := 0; i < n; i++ {
		msg := nats.NewMsg(subject + "." + name)
		msg.Data = payload
		for k, v := range headers {
			msg.Header[k] = []string{v}
		}
		id := fmt.Sprintf("%s-%d", name, i)
		msg.Header["Nats-Msg-Id"] = []string{id}
		msg.Header["ce-id"] = []string{id}
		msg.Header.Set("Bench-Seq", strconv.Itoa(i))
		sent[i] = time.Now()
		if sequential {
			_, err := js.PublishMsg(ctx, msg)
			check(err)
			<-next
			continue
		}
		publishAsync(js, msg)
	}
	<-done
	elapsed := time.Since(start)
	cpu := cpuTime() - cpuStart
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	return result{
		Events:       n,
		EventsPerSec: float64(n) / elapsed.Seconds(),
		CPUMicros:    micros(cpu) / float64(n),
		P50Micros:    micros(latencies[len(latencies)/2]),
		P99Micros:    micros(latencies[len(latencies)*99/100]),
	}
}

// publishAsync publishes without waiting for the ack; when too many acks are outstanding
// (a loaded machine) it waits for them and tries again rather than failing the run.
func publishAsync(js jetstream.JetStream, msg *nats.Msg) {
	for {
		_, err := js.PublishMsgAsync(msg)
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			check(err)
			return
		}
		<-js.PublishAsyncComplete()
	}
}

// cpuTime is the user and system CPU time of the whole process so far.
func cpuTime() time.Duration {
	var usage syscall.Rusage
	check(syscall.Getrusage(syscall.RUSAGE_SELF, &usage))
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "busbench:", err)
		os.Exit(1)
	}
}
