package ruby

import (
	"encoding/binary"
	"fmt"

	"github.com/profsym/profsym/internal/host/runtimes"
)

// A C function's frame is named by its method entry's called_id, an ID:
// a serial number whose string is in Ruby's global symbol table
// (ruby_global_symbols: {last_id, str_sym, ids, dsymbol_fstr_hash}), which
// libruby does not export. It is found once per process in libruby's
// .data: the one place whose words read as a last ID, a table, an Array
// of Arrays and a Hash.

const (
	tHash        = 0x08
	idScopeShift = 4    // RUBY_ID_SCOPE_SHIFT
	lastOpID     = 0xa9 // tLAST_OP_ID: operators are not in the table
	idEntryUnit  = 512  // ID_ENTRY_UNIT: IDs a row of the table
	maxDataScan  = 1 << 20
	meCalledID   = 24 // rb_callable_method_entry_t.called_id
)

// findSymbols finds ruby_global_symbols in data, libruby's .data as read
// from the process at addr; 0 when no place reads as it.
func findSymbols(m memory, data []byte, addr uint64) uint64 {
	for off := 0; off+32 <= len(data); off += 8 {
		last := binary.LittleEndian.Uint64(data[off:])
		tbl := binary.LittleEndian.Uint64(data[off+8:])
		ids := binary.LittleEndian.Uint64(data[off+16:])
		hash := binary.LittleEndian.Uint64(data[off+24:])
		if last < 256 || last > 1<<24 || tbl == 0 || tbl&7 != 0 || ids == 0 || ids&7 != 0 || hash == 0 || hash&7 != 0 {
			continue
		}
		if fl, err := m.U64(ids); err != nil || fl&tMask != tArray {
			continue
		}
		if fl, err := m.U64(hash); err != nil || fl&tMask != tHash {
			continue
		}
		row, err := arrayAt(m, ids, 0)
		if err != nil {
			continue
		}
		if fl, err := m.U64(row); err != nil || fl&tMask != tArray {
			continue
		}
		return addr + uint64(off) //nolint:gosec // off < len(data)
	}
	return 0
}

// arrayAt is element i of the RArray at obj.
func arrayAt(m memory, obj uint64, i uint64) (uint64, error) {
	var hdr [40]byte
	if err := m.Read(obj, hdr[:]); err != nil {
		return 0, err
	}
	fl := binary.LittleEndian.Uint64(hdr[:])
	if fl&tMask != tArray {
		return 0, fmt.Errorf("object %#x is no array: %w", obj, runtimes.ErrBadFrame)
	}
	var n, ptr uint64
	if fl&flNoEmbed != 0 { // RARRAY_EMBED_FLAG
		n, ptr = fl>>15&0x7f, obj+16
	} else {
		n, ptr = binary.LittleEndian.Uint64(hdr[16:]), binary.LittleEndian.Uint64(hdr[32:])
	}
	if i >= n {
		return 0, fmt.Errorf("element %d of %d: %w", i, n, runtimes.ErrBadFrame)
	}
	return m.U64(ptr + 8*i)
}

// idName is the string of ID id, from the global symbol table at symbols.
func idName(m memory, l *layout, symbols, id uint64, maxName int) (string, error) {
	if symbols == 0 || id <= lastOpID {
		return "", fmt.Errorf("ID %#x not in the table: %w", id, runtimes.ErrBadFrame)
	}
	serial := id >> idScopeShift
	ids, err := m.U64(symbols + 16)
	if err != nil {
		return "", err
	}
	row, err := arrayAt(m, ids, serial/idEntryUnit)
	if err != nil {
		return "", err
	}
	str, err := arrayAt(m, row, serial%idEntryUnit*2)
	if err != nil {
		return "", err
	}
	return readString(m, l, str, maxName)
}
