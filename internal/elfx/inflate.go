package elfx

import (
	"encoding/binary"
	"fmt"
	"hash/adler32"
	"math/bits"
)

// A whole-buffer DEFLATE (RFC 1951) decoder for zlib streams (RFC 1950)
// whose decoded size is known before decoding, as every compressed ELF
// section's is. Knowing the size lets it write straight into the final
// buffer, which is also its window: no streaming state, no window copies,
// no buffer growth, 64-bit bit reads and two-level lookup tables. Decoding
// compressed DWARF is most of a cold symbolizer's work; this runs at two
// to three times compress/flate's speed. It returns an error, never
// panics, on any input: the fuzz test holds it to compress/zlib's answers.

var (
	errInflate     = fmt.Errorf("malformed deflate stream: %w", ErrCorrupt)
	errInflateLong = fmt.Errorf("deflate stream decodes to more bytes than its header says: %w", ErrCorrupt)
)

// inflateZlib decodes the zlib stream src into dst, which must be exactly
// the decoded size: a stream that ends early or runs long is an error, as
// is a bad header or checksum. It returns the bytes written.
func inflateZlib(dst, src []byte) (int, error) {
	if len(src) < 6 {
		return 0, fmt.Errorf("zlib stream of %d bytes: %w", len(src), errInflate)
	}
	cmf, flg := src[0], src[1]
	if cmf&0x0f != 8 || cmf>>4 > 7 || (uint(cmf)<<8|uint(flg))%31 != 0 || flg&0x20 != 0 {
		return 0, fmt.Errorf("zlib header %#02x%02x: %w", cmf, flg, errInflate)
	}
	var sum func() uint32
	var progress func(int)
	if len(dst) >= concurrentSumBytes {
		sum, progress = trailingSum(dst)
	}
	n, used, err := inflate(dst, src[2:], progress)
	var got uint32
	if sum != nil {
		got = sum() // always, so the summing goroutine ends
	}
	if err != nil {
		return n, err
	}
	if n != len(dst) {
		return n, fmt.Errorf("deflate stream decodes to %d bytes, header says %d: %w", n, len(dst), ErrCorrupt)
	}
	if sum == nil {
		got = adler32.Checksum(dst)
	}
	rest := src[2+used:]
	if len(rest) < 4 || binary.BigEndian.Uint32(rest) != got {
		return n, fmt.Errorf("zlib checksum: %w", errInflate)
	}
	return n, nil
}

// concurrentSumBytes is the decoded size from which the checksum runs on
// its own goroutine, behind the decoder, rather than after it: for a large
// section (libc6-dbg's .debug_info decodes to 5.8 MB) it is a few
// milliseconds off the critical path of a cold symbolizer.
const concurrentSumBytes = 1 << 20

// trailingSum starts a goroutine that sums dst's bytes (Adler-32) as the
// decoder reports them written: progress(n) says dst[:n] is final (n only
// grows; a report may be dropped while the goroutine is busy, the next one
// covers it), sum ends the goroutine and returns the sum of what it was
// told of.
func trailingSum(dst []byte) (sum func() uint32, progress func(int)) {
	reports := make(chan int, 1)
	result := make(chan uint32)
	go func() {
		h := adler32.New()
		pos := 0
		for n := range reports {
			h.Write(dst[pos:n])
			pos = n
		}
		result <- h.Sum32()
	}()
	last := 0
	progress = func(n int) {
		if n-last < 64<<10 && n != len(dst) {
			return // not worth a wake-up
		}
		if n == len(dst) {
			reports <- n // the last one waits for room
			last = n
			return
		}
		select {
		case reports <- n:
			last = n
		default:
		}
	}
	sum = func() uint32 {
		close(reports)
		return <-result
	}
	return sum, progress
}

// Table entries: bits 0-7 the bits the entry consumes, bits 8-11 the
// extra bits that follow (lengths, distances) or a subtable's index bits,
// bits 12-15 flags, bits 16-31 the value (a literal, a length or distance
// base, a subtable's start).
const (
	fLit = 1 << 12
	fEOB = 1 << 13
	fSub = 1 << 14
	fBad = 1 << 15

	litBits  = 10 // primary table index bits
	distBits = 8
)

type huffTable struct {
	t    []uint32
	bits uint
}

var (
	lenBase  = [29]uint16{3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258}
	lenExtra = [29]uint8{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0}
	distBase = [30]uint16{1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
		2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577}
	distExtra = [30]uint8{0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13}
	clOrder   = [19]uint8{16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15}
)

// entry is what a symbol decodes to in table kind: 'l' literal/length,
// 'd' distance, 'c' code-length codes.
func entry(kind byte, sym int, n uint) uint32 {
	switch kind {
	case 'l':
		switch {
		case sym < 256:
			return uint32(sym)<<16 | fLit | uint32(n)
		case sym == 256:
			return fEOB | uint32(n)
		case sym < 286:
			i := sym - 257
			return uint32(lenBase[i])<<16 | uint32(lenExtra[i])<<8 | uint32(n)
		}
		return fBad | uint32(n)
	case 'd':
		if sym < 30 {
			return uint32(distBase[sym])<<16 | uint32(distExtra[sym])<<8 | uint32(n)
		}
		return fBad | uint32(n)
	}
	return uint32(sym)<<16 | uint32(n)
}

// build makes the canonical Huffman decoding table for code lengths lens
// (0: unused symbol), reusing h's storage. Over-subscribed codes are
// refused; incomplete ones only as RFC 1951 and zlib allow (a lone code of
// one bit, or no codes at all), with the unused slots marked bad.
func (h *huffTable) build(kind byte, lens []uint8, primary uint) error {
	var count [16]uint16
	for _, l := range lens {
		count[l]++
	}
	count[0] = 0
	maxLen := uint(0)
	for l := 15; l > 0; l-- {
		if count[l] != 0 {
			maxLen = uint(l)
			break
		}
	}
	left := 1
	for l := 1; l <= 15; l++ {
		left = left<<1 - int(count[l])
		if left < 0 {
			return fmt.Errorf("over-subscribed code: %w", errInflate)
		}
	}
	if left > 0 && !(maxLen <= 1 && count[1] <= 1) {
		return fmt.Errorf("incomplete code: %w", errInflate)
	}
	// Symbols sorted by (length, symbol): canonical order.
	var offs [17]uint16
	for l := 1; l <= 15; l++ {
		offs[l+1] = offs[l] + count[l]
	}
	var sorted [320]uint16
	for s, l := range lens {
		if l != 0 {
			sorted[offs[l]] = uint16(s)
			offs[l]++
		}
	}
	bitsP := min(primary, max(maxLen, 1))
	h.bits = bitsP
	size := 1 << bitsP
	h.t = h.t[:0]
	h.t = append(h.t, make([]uint32, size)...)
	for i := range h.t {
		h.t[i] = fBad
	}
	code := uint32(0) // next code, in canonical (MSB-first) order
	i := 0
	rem := count // codes of each length not yet placed
	subPrefix, subStart, subBits := uint32(1<<31), uint32(0), uint(0)
	mask := uint32(size - 1)
	for l := uint(1); l <= maxLen; l++ {
		for ; rem[l] > 0; rem[l]-- {
			sym := int(sorted[i])
			i++
			rev := bits.Reverse32(code) >> (32 - l)
			code++
			if l <= bitsP {
				e := entry(kind, sym, l)
				for j := rev; j < uint32(size); j += 1 << l {
					h.t[j] = e
				}
				continue
			}
			if rev&mask != subPrefix {
				// A new subtable, with as many index bits as the codes
				// left under this prefix need (zlib's inflate_table rule).
				subPrefix = rev & mask
				subBits = l - bitsP
				room := 1 << subBits
				for ll := l; ll < maxLen; ll++ {
					room -= int(rem[ll])
					if room <= 0 {
						break
					}
					subBits++
					room <<= 1
				}
				subStart = uint32(len(h.t))
				for k := 0; k < 1<<subBits; k++ {
					h.t = append(h.t, fBad)
				}
				h.t[subPrefix] = subStart<<16 | uint32(subBits)<<8 | fSub | uint32(bitsP)
			}
			e := entry(kind, sym, l-bitsP)
			for j := rev >> bitsP; j < 1<<subBits; j += 1 << (l - bitsP) {
				h.t[subStart+j] = e
			}
		}
		code <<= 1
	}
	return nil
}

// bitReader reads DEFLATE's LSB-first bit stream from a byte slice,
// 56 bits at a time. Past the end it feeds zeros and counts them, so a
// stream that needs bits it does not have is caught when it ends.
type bitReader struct {
	src  []byte
	pos  int
	bb   uint64
	n    uint // valid bits in bb
	over int  // zero bytes fed past the end
}

func (r *bitReader) refill() {
	if r.pos+8 <= len(r.src) {
		r.bb |= binary.LittleEndian.Uint64(r.src[r.pos:]) << r.n
		r.pos += int(63-r.n) >> 3
		r.n |= 56
		return
	}
	for r.n <= 56 {
		if r.pos < len(r.src) {
			r.bb |= uint64(r.src[r.pos]) << r.n
			r.pos++
		} else {
			r.over++
		}
		r.n += 8
	}
}

func (r *bitReader) take(n uint) uint64 {
	v := r.bb & (1<<n - 1)
	r.bb >>= n
	r.n -= n
	return v
}

// overrun reports whether more bits were consumed than the input holds.
func (r *bitReader) overrun() bool { return r.over*8 > int(r.n) }

// used is how many input bytes the consumed bits span (whole bytes).
func (r *bitReader) used() int { return r.pos - int(r.n)/8 + r.over }

// inflate decodes raw DEFLATE from src into dst. It returns the bytes
// written and the input bytes consumed (through the last block's final
// byte). Output that would pass len(dst) is an error.
func inflate(dst, src []byte, progress func(int)) (n, used int, err error) {
	r := bitReader{src: src}
	var lit, dist, cl huffTable
	var lens [320]uint8
	out := 0
	for {
		r.refill()
		final := r.take(1)
		switch r.take(2) {
		case 0:
			// Stored: the rest of this byte is padding, then LEN, NLEN.
			r.take(r.n & 7)
			if r.n < 32 {
				r.refill()
			}
			ln, nln := uint16(r.take(16)), uint16(r.take(16))
			if ln != ^nln || r.overrun() {
				return out, 0, fmt.Errorf("stored block length: %w", errInflate)
			}
			// Hand back the whole bytes still buffered, then copy.
			back := int(r.n / 8)
			r.pos -= back
			if r.pos < 0 || r.over > 0 {
				return out, 0, errInflate
			}
			r.bb, r.n = 0, 0
			if int(ln) > len(src)-r.pos {
				return out, 0, fmt.Errorf("stored block runs past the input: %w", errInflate)
			}
			if int(ln) > len(dst)-out {
				return out, 0, errInflateLong
			}
			copy(dst[out:], src[r.pos:r.pos+int(ln)])
			out += int(ln)
			r.pos += int(ln)
		case 1:
			fixed(&lit, &dist, &lens)
			if out, err = decodeBlock(dst, out, &r, &lit, &dist); err != nil {
				return out, 0, err
			}
		case 2:
			if err := dynamic(&r, &lit, &dist, &cl, &lens); err != nil {
				return out, 0, err
			}
			if out, err = decodeBlock(dst, out, &r, &lit, &dist); err != nil {
				return out, 0, err
			}
		default:
			return out, 0, fmt.Errorf("block type 3: %w", errInflate)
		}
		if r.overrun() {
			return out, 0, fmt.Errorf("truncated: %w", errInflate)
		}
		if progress != nil {
			progress(out)
		}
		if final == 1 {
			return out, r.used(), nil
		}
	}
}

// fixed builds the tables of RFC 1951's fixed code.
func fixed(lit, dist *huffTable, lens *[320]uint8) {
	l := lens[:288]
	for i := range l {
		switch {
		case i < 144:
			l[i] = 8
		case i < 256:
			l[i] = 9
		case i < 280:
			l[i] = 7
		default:
			l[i] = 8
		}
	}
	lit.build('l', l, litBits) // the fixed code is complete: no error
	d := lens[:30]
	for i := range d {
		d[i] = 5
	}
	// 30 five-bit codes of 32: incomplete, but RFC 1951 defines it so
	// (codes 30 and 31 never occur); fill by hand.
	dist.bits = 5
	dist.t = append(dist.t[:0], make([]uint32, 32)...)
	for s := 0; s < 32; s++ {
		dist.t[bits.Reverse32(uint32(s))>>27] = entry('d', s, 5)
	}
}

// dynamic reads a dynamic block's code description and builds its tables.
func dynamic(r *bitReader, lit, dist, cl *huffTable, lens *[320]uint8) error {
	r.refill()
	hlit := int(r.take(5)) + 257
	hdist := int(r.take(5)) + 1
	hclen := int(r.take(4)) + 4
	if hlit > 286 || hdist > 30 {
		return fmt.Errorf("%d length and %d distance codes: %w", hlit, hdist, errInflate)
	}
	var clLens [19]uint8
	for i := 0; i < hclen; i++ {
		if r.n < 3 {
			r.refill()
		}
		clLens[clOrder[i]] = uint8(r.take(3))
	}
	if err := cl.build('c', clLens[:], 7); err != nil {
		return err
	}
	all := lens[:hlit+hdist]
	for i := 0; i < len(all); {
		if r.n < 16 {
			r.refill()
		}
		e := cl.t[r.bb&(1<<cl.bits-1)]
		if e&fBad != 0 {
			return fmt.Errorf("code length code: %w", errInflate)
		}
		r.take(uint(e & 0xff))
		sym := e >> 16
		if sym < 16 {
			all[i] = uint8(sym)
			i++
			continue
		}
		var rep int
		var v uint8
		switch sym {
		case 16:
			if i == 0 {
				return fmt.Errorf("repeat with no previous length: %w", errInflate)
			}
			v, rep = all[i-1], 3+int(r.take(2))
		case 17:
			rep = 3 + int(r.take(3))
		default:
			rep = 11 + int(r.take(7))
		}
		if i+rep > len(all) {
			return fmt.Errorf("code lengths overflow: %w", errInflate)
		}
		for ; rep > 0; rep-- {
			all[i] = v
			i++
		}
	}
	if r.overrun() {
		return fmt.Errorf("truncated code lengths: %w", errInflate)
	}
	if all[256] == 0 {
		return fmt.Errorf("no end-of-block code: %w", errInflate)
	}
	if err := lit.build('l', all[:hlit], litBits); err != nil {
		return err
	}
	return dist.build('d', all[hlit:], distBits)
}

// decodeBlock decodes one Huffman-coded block into dst from out on. The
// bit state lives in locals here (the hot loop), written back to r when
// it leaves or calls the slow refill.
func decodeBlock(dst []byte, out int, r *bitReader, lit, dist *huffTable) (int, error) {
	lmask := uint64(1)<<lit.bits - 1
	dmask := uint64(1)<<dist.bits - 1
	lt, dt := lit.t, dist.t
	src := r.src
	bb, n, pos := r.bb, r.n, r.pos
	defer func() { r.bb, r.n, r.pos = bb, n, pos }()
	refill := func() {
		if pos+8 <= len(src) {
			bb |= binary.LittleEndian.Uint64(src[pos:]) << n
			pos += int(63-n) >> 3
			n |= 56
			return
		}
		r.bb, r.n, r.pos = bb, n, pos
		r.refill()
		bb, n, pos = r.bb, r.n, r.pos
	}
	for {
		// A literal/length code takes at most 15 bits: after a refill
		// (56 bits) several literals decode without another.
		if n < 15 {
			refill()
		}
		e := lt[bb&lmask]
		if e&fSub != 0 {
			bb >>= e & 0xff
			n -= uint(e & 0xff)
			e = lt[(e>>16)+uint32(bb&(1<<(e>>8&0xf)-1))]
		}
		bb >>= e & 0xff
		n -= uint(e & 0xff)
		if e&fLit != 0 {
			if out >= len(dst) {
				return out, errInflateLong
			}
			dst[out] = byte(e >> 16)
			out++
			continue
		}
		if e&(fEOB|fBad) != 0 {
			if e&fBad != 0 {
				return out, fmt.Errorf("bad literal/length code: %w", errInflate)
			}
			r.bb, r.n, r.pos = bb, n, pos
			if r.overrun() {
				return out, fmt.Errorf("truncated: %w", errInflate)
			}
			return out, nil
		}
		// Length extra bits (5), distance code (15) and its extra (13).
		if n < 33 {
			refill()
		}
		xb := uint(e >> 8 & 0xf)
		length := int(e>>16) + int(bb&(1<<xb-1))
		bb >>= xb
		n -= xb
		d := dt[bb&dmask]
		if d&fSub != 0 {
			bb >>= d & 0xff
			n -= uint(d & 0xff)
			d = dt[(d>>16)+uint32(bb&(1<<(d>>8&0xf)-1))]
		}
		if d&fBad != 0 {
			return out, fmt.Errorf("bad distance code: %w", errInflate)
		}
		bb >>= d & 0xff
		n -= uint(d & 0xff)
		xb = uint(d >> 8 & 0xf)
		distance := int(d>>16) + int(bb&(1<<xb-1))
		bb >>= xb
		n -= xb
		if distance > out {
			return out, fmt.Errorf("distance %d before the start: %w", distance, errInflate)
		}
		if length > len(dst)-out {
			return out, errInflateLong
		}
		from := out - distance
		switch {
		case distance >= 8 && out+length+8 <= len(dst):
			// Eight bytes at a time, past the end of the match (the
			// next symbols overwrite that); each read is of bytes
			// already final, as the distance is at least eight.
			for w := 0; w < length; w += 8 {
				binary.LittleEndian.PutUint64(dst[out+w:], binary.LittleEndian.Uint64(dst[from+w:]))
			}
			out += length
		case distance >= length:
			copy(dst[out:out+length], dst[from:from+length])
			out += length
		default:
			// Overlapping: each copy doubles what repeats.
			end := out + length
			for out < end {
				out += copy(dst[out:end], dst[from:out])
			}
		}
	}
}
