// front-loadgen: the streaming load of `v41flash bench front` (bench/v41flash_bench/front_bench.py builds and runs
// it; Go's standard library only). It sends POST /v1/chat/completions with stream true to the given targets
// (round robin) and reads each SSE answer as it arrives:
//
//	-mode rate:    open loop, Poisson arrivals at -rate requests/s for -seconds;
//	-mode streams: closed loop, -streams clients each sending its next request when the last one ended.
//
// It prints one JSON object: requests, errors, tokens (SSE data events but [DONE]), wall seconds, tokens/s (the
// tokens that arrived within -seconds, over -seconds), and the TTFT (request sent -> first event) and ITL (between
// events of one answer) percentiles in ms.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

type result struct {
	mu       sync.Mutex
	requests int
	errors   int
	tokens   int
	inWindow int // tokens that arrived before the phase ended (throughput: the tail of the last answers is left out)
	ttft     []float64
	itl      []float64
}

var end time.Time // the phase's end: no request starts after it

func (r *result) add(tokens, inWindow int, ttft float64, itl []float64, err bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inWindow += inWindow
	if err {
		r.errors++
		return
	}
	r.requests++
	r.tokens += tokens
	r.ttft = append(r.ttft, ttft)
	r.itl = append(r.itl, itl...)
}

func body(session, tokens, kib int) []byte {
	var words strings.Builder
	for i := 0; i < kib*1024/6; i++ {
		fmt.Fprintf(&words, "w%d ", (session*7+i)%997)
	}
	b, _ := json.Marshal(map[string]any{
		"model": os.Getenv("LOADGEN_MODEL"), "stream": true, "max_tokens": tokens, "ignore_eos": true,
		"messages": []map[string]string{
			{"role": "system", "content": "You are a coding agent."},
			{"role": "user", "content": fmt.Sprintf("session %d: %s", session, words.String())},
		},
	})
	return b
}

func one(client *http.Client, url string, payload []byte, res *result) {
	t0 := time.Now()
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(payload))
	if err != nil {
		res.add(0, 0, 0, nil, true)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		io.Copy(io.Discard, resp.Body)
		res.add(0, 0, 0, nil, true)
		return
	}
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	var ttft float64
	var last time.Time
	itl := make([]float64, 0, 128)
	events, inWindow := 0, 0
	done := false
	for {
		line, err := rd.ReadSlice('\n')
		if len(line) > 6 && bytes.HasPrefix(line, []byte("data: ")) {
			if bytes.HasPrefix(line[6:], []byte("[DONE]")) {
				done = true
			} else {
				now := time.Now()
				if events == 0 {
					ttft = float64(now.Sub(t0).Microseconds()) / 1000
				} else {
					itl = append(itl, float64(now.Sub(last).Microseconds())/1000)
				}
				last = now
				events++
				if now.Before(end) {
					inWindow++
				}
			}
		}
		if err != nil {
			break
		}
	}
	res.add(events, inWindow, ttft, itl, !done)
}

func pct(v []float64, p float64) any {
	if len(v) == 0 {
		return nil
	}
	sort.Float64s(v)
	i := int(p * float64(len(v)))
	if i >= len(v) {
		i = len(v) - 1
	}
	return v[i]
}

func main() {
	mode := flag.String("mode", "rate", "rate | streams")
	targets := flag.String("targets", "", "comma-separated base URLs")
	rate := flag.Float64("rate", 10, "requests/s (mode rate)")
	streams := flag.Int("streams", 100, "clients (mode streams)")
	seconds := flag.Float64("seconds", 10, "how long")
	tokens := flag.Int("tokens", 64, "tokens an answer")
	kib := flag.Int("body-kib", 4, "request body size")
	seed := flag.Int64("seed", 1, "arrival seed")
	flag.Parse()
	urls := strings.Split(*targets, ",")
	tr := &http.Transport{MaxIdleConnsPerHost: 100000, MaxConnsPerHost: 0, DisableCompression: true}
	client := &http.Client{Transport: tr}
	res := &result{}
	var wg sync.WaitGroup
	start := time.Now()
	end = start.Add(time.Duration(*seconds * float64(time.Second)))
	if *mode == "rate" {
		rng := rand.New(rand.NewSource(*seed))
		t := 0.0
		for i := 0; ; i++ {
			t += rng.ExpFloat64() / *rate
			at := start.Add(time.Duration(t * float64(time.Second)))
			if at.After(end) {
				break
			}
			time.Sleep(time.Until(at))
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				one(client, urls[i%len(urls)], body(i, *tokens, *kib), res)
			}(i)
		}
	} else {
		for k := 0; k < *streams; k++ {
			wg.Add(1)
			go func(k int) {
				defer wg.Done()
				for i := k; time.Now().Before(end); i += *streams {
					one(client, urls[k%len(urls)], body(i, *tokens, *kib), res)
				}
			}(k)
		}
	}
	wg.Wait()
	wall := time.Since(start).Seconds()
	out := map[string]any{
		"requests": res.requests, "errors": res.errors, "tokens": res.tokens, "wall_s": wall,
		"tokens_in_window": res.inWindow, "tokens_per_s": float64(res.inWindow) / *seconds,
		"requests_per_s": float64(res.requests) / wall,
		"ttft_p50_ms": pct(res.ttft, 0.5), "ttft_p99_ms": pct(res.ttft, 0.99),
		"itl_p50_ms": pct(res.itl, 0.5), "itl_p99_ms": pct(res.itl, 0.99),
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
