package php

import (
	"fmt"

	"github.com/profsym/profsym/bpf"
)

// layout is where the walker and the namer find things in one PHP
// version's structures (x86-64, non-thread-safe builds). PHP exports no
// description of its structures: these are per version, from its headers
// (Zend/zend_globals.h, zend_compile.h, zend_types.h), each checked on a
// process of that version (internal/e2e Test(Record|Collector)PHPChains,
// the live check at attach).
type layout struct {
	egCurrentEx uint16 // zend_executor_globals.current_execute_data
	exOpline    uint16 // zend_execute_data.opline
	exFunc      uint16 // zend_execute_data.func
	exInfo      uint16 // zend_execute_data.This.u1.type_info
	exPrev      uint16 // zend_execute_data.prev_execute_data
	callTop     uint32 // ZEND_CALL_TOP in type_info
	fnName      uint16 // zend_function.common.function_name
	fnScope     uint16 // zend_function.common.scope
	fnFilename  uint16 // zend_op_array.filename
	fnLineStart uint16 // zend_op_array.line_start; line_end follows
	opLineno    uint16 // zend_op.lineno
	ceName      uint16 // zend_class_entry.name
	strType     uint16 // zend_string.gc.u.type_info
	strHash     uint16 // zend_string.h
	strLen      uint16 // zend_string.len
	strVal      uint16 // zend_string.val
}

// layouts by PHP minor version (8.x). A version not here is refused with
// its reason: 8.3 and 8.5 differ in the op_array and are not checked yet.
var layouts = map[[2]int]layout{
	{8, 2}: base(152),
	{8, 4}: base(168),
}

// base is PHP 8's layout with the op_array's filename at filename
// (line_start follows it).
func base(filename uint16) layout {
	return layout{
		egCurrentEx: 488,
		exOpline:    0, exFunc: 24, exInfo: 40, exPrev: 48,
		callTop: 1 << 17,
		fnName:  8, fnScope: 16, fnFilename: filename, fnLineStart: filename + 8,
		opLineno: 24,
		ceName:   8,
		strType:  4, strHash: 8, strLen: 16, strVal: 24,
	}
}

func layoutFor(major, minor int) (layout, error) {
	l, ok := layouts[[2]int{major, minor}]
	if !ok {
		return layout{}, fmt.Errorf("no layout for PHP %d.%d (8.2 and 8.4 are walked): %w", major, minor, errUnsupported)
	}
	return l, nil
}

// fnSize is how much of a user function the walker reads.
func (l *layout) fnSize() uint64 {
	return max(uint64(l.fnName), uint64(l.fnScope), uint64(l.fnFilename)) + 8 + 8
}

// bpf is the walker's entry for a process whose current_execute_data is at
// cur.
func (l *layout) bpf(cur uint64) bpf.ProfilePhpProc {
	return bpf.ProfilePhpProc{
		CurrentEx: cur, CallTop: l.callTop,
		ExOpline: l.exOpline, ExFunc: l.exFunc, ExInfo: l.exInfo, ExPrev: l.exPrev,
		FnName: l.fnName, FnScope: l.fnScope, FnFilename: l.fnFilename, FnLineStart: l.fnLineStart,
		FnSize: uint16(l.fnSize()), OpLineno: l.opLineno,
		StrHash: l.strHash, StrLen: l.strLen,
	}
}

// check bounds every offset by what the walker reads.
func (l *layout) check() error {
	ex := uint16(bpf.ProfilePhpLimitsPHP_EX_READ)
	fn := uint64(bpf.ProfilePhpLimitsPHP_FUNC_READ)
	common := uint16(bpf.ProfilePhpLimitsPHP_FUNC_COMMON)
	switch {
	case l.exOpline+8 > ex || l.exFunc+8 > ex || l.exPrev+8 > ex || l.exInfo+4 > ex:
		return fmt.Errorf("execute_data fields past %d bytes: %w", ex, errLayout)
	case l.fnName+8 > common || l.fnScope+8 > common:
		return fmt.Errorf("function name fields past %d bytes: %w", common, errLayout)
	case l.fnSize() > fn || uint64(l.fnLineStart)+8 > l.fnSize(): // line_start, line_end
		return fmt.Errorf("op_array fields past %d bytes: %w", fn, errLayout)
	case l.callTop == 0:
		return fmt.Errorf("no ZEND_CALL_TOP bit: %w", errLayout)
	}
	return nil
}
