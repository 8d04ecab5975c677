package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"iter"
	"strconv"
	"strings"
)

// inputLine is one line of `profsym symbolize`'s input, parsed.
type inputLine struct {
	line    string // as read, trimmed
	target  target
	addrStr string
	addr    uint64
	ok      bool // target and address parsed
}

// Bounds of one input line and of one batch.
const (
	maxInputLine = 1 << 20
	maxBatch     = 4096
)

// inputBatches reads stdin on a goroutine of its own and yields the lines
// read so far, in order, in batches: all that is waiting (up to maxBatch),
// or the next line when none is. Interactive callers (pprof) get each line
// as soon as it comes; a file of addresses comes in large batches, whose
// units the engine can parse ahead, in parallel (see prefetch).
func (c *symbolizeCmd) inputBatches(stdin io.Reader) iter.Seq[[]inputLine] {
	return func(yield func([]inputLine) bool) {
		lines := make(chan string, maxBatch)
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			defer close(lines)
			br := bufio.NewReaderSize(stdin, 64<<10)
			for {
				line, err := readLine(br)
				if line = strings.TrimSpace(line); line != "" {
					select {
					case lines <- line:
					case <-stop:
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		var batch []inputLine
		for line := range lines {
			batch = append(batch[:0], parseLine(c, line))
		more:
			for len(batch) < maxBatch {
				select {
				case l, ok := <-lines:
					if !ok {
						break more
					}
					batch = append(batch, parseLine(c, l))
				default:
					break more
				}
			}
			if !yield(batch) {
				return
			}
		}
	}
}

// readLine reads one line, keeping at most maxInputLine bytes of it.
func readLine(br *bufio.Reader) (string, error) {
	var long []byte
	for {
		b, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			if len(long) < maxInputLine {
				long = append(long, b[:min(len(b), maxInputLine-len(long))]...)
			}
			continue
		}
		if long != nil {
			if len(long) < maxInputLine {
				long = append(long, b[:min(len(b), maxInputLine-len(long))]...)
			}
			return string(bytes.TrimRight(long, "\r\n")), err
		}
		return string(bytes.TrimRight(b, "\r\n")), err
	}
}

// parseLine parses one input line.
func parseLine(c *symbolizeCmd, line string) inputLine {
	in := inputLine{line: line}
	t, addrStr, ok := c.parseInput(line)
	if !ok {
		return in
	}
	addr, err := strconv.ParseUint(addrStr, 0, 64)
	if err != nil {
		return in
	}
	in.target, in.addrStr, in.addr, in.ok = t, addrStr, addr, true
	return in
}

// prefetch has the engine parse, in the background and in parallel, the
// units of the batch's addresses, per object, before they are answered in
// order. The answers do not change.
func (c *symbolizeCmd) prefetch(ctx context.Context, r *objects, batch []inputLine) {
	if len(batch) < 2 {
		return
	}
	byTarget := map[target][]uint64{}
	var order []target
	for i := range batch {
		in := &batch[i]
		if !in.ok {
			continue
		}
		if _, ok := byTarget[in.target]; !ok {
			order = append(order, in.target)
		}
		byTarget[in.target] = append(byTarget[in.target], in.addr-c.vma)
	}
	for _, t := range order {
		if t.Path == "" && t.BuildID == "" {
			continue
		}
		if h, err := r.handle(ctx, t); err == nil {
			h.Prefetch(byTarget[t], 0)
		}
	}
}
