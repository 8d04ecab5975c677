package ruby

import (
	"fmt"

	"github.com/profsym/profsym/bpf"
)

// layout is where the walker and the namer find things in one Ruby
// version's structures (x86-64). Ruby exports no description of its
// structures: these are per version, from its headers (vm_core.h, iseq.h,
// method.h, internal/class.h, rstring.h), each checked on a process of
// that version (internal/e2e TestRecordRubyChains, the live check at
// attach).
type layout struct {
	ecVMStack, ecStackLen, ecCfp  uint16 // rb_execution_context_t
	cfpPC, cfpIseq, cfpEP, cfpLen uint16 // rb_control_frame_t, and its size
	iseqBody                      uint16 // rb_iseq_t.body
	bodyType, bodySize            uint16 // rb_iseq_constant_body.type, .iseq_size
	bodyEncoded                   uint16 // .iseq_encoded
	bodyLocation                  uint16 // .location (pathobj, base_label, label, first_lineno)
	bodyInsnInfo                  uint16 // .insns_info.body
	bodyInsnSize, bodySucc        uint16 // .insns_info.size, .insns_info.succ_index_table
	insnEntry                     uint16 // sizeof(struct iseq_insn_info_entry); line_no first
	meDef, meOwner                uint16 // rb_callable_method_entry_t
	defOriginalID                 uint16 // rb_method_definition_t.original_id
	strEmbedLenInFlags            bool   // 3.1: an embedded string's length is in its flags
	strEmbed                      uint16 // an embedded RString's bytes
	// Class names: 3.1 keeps the class path as the first instance
	// variable of the class (ext->iv_tbl, an st_table); 3.3 in its ext,
	// which follows the RClass.
	classExt       uint16 // 3.1: RClass's ext pointer; 3.3: the ext's offset in the RClass
	classExtInline bool
	extIvTbl       uint16 // 3.1: ext->iv_tbl
	extClasspath   uint16 // 3.3: ext->classpath
	extAttached    uint16 // 3.3: ext->as.singleton_class.attached_object
	valueSize      uint16
	succImmediate  uint16 // IMMEDIATE_TABLE_SIZE
	succPart       uint16 // succ_index_table.succ_part
	succBlock      uint16 // sizeof(struct succ_dict_block)
	succBlockRanks uint16
	succBlockBits  uint16
}

// layouts by Ruby minor version (3.x). A version not here is refused with
// its reason.
var layouts = map[[2]int]layout{
	{3, 1}: v31(),
	{3, 3}: v33(),
}

func base() layout {
	return layout{
		ecVMStack: 0, ecStackLen: 8, ecCfp: 16,
		cfpPC: 0, cfpIseq: 16, cfpEP: 32,
		iseqBody: 16,
		bodyType: 0, bodySize: 4, bodyEncoded: 8, bodyLocation: 64,
		insnEntry: 12,
		meDef:     16, meOwner: 32, defOriginalID: 32,
		valueSize:     8,
		succImmediate: 54, succPart: 48, succBlock: 80, succBlockRanks: 8, succBlockBits: 16,
	}
}

func v31() layout {
	l := base()
	l.cfpLen = 64 // pc, sp, iseq, self, ep, block_code, __bp__, jit_return
	l.bodyInsnInfo, l.bodyInsnSize, l.bodySucc = 120, 136, 144
	l.strEmbedLenInFlags, l.strEmbed = true, 16
	l.classExt, l.extIvTbl = 24, 8
	return l
}

func v33() layout {
	l := base()
	l.cfpLen = 56 // __bp__ is gone
	l.bodyInsnInfo, l.bodyInsnSize, l.bodySucc = 112, 128, 136
	l.strEmbed = 24
	l.classExtInline = true
	l.classExt, l.extClasspath, l.extAttached = 32, 120, 96
	return l
}

func layoutFor(major, minor int) (layout, error) {
	l, ok := layouts[[2]int{major, minor}]
	if !ok {
		return layout{}, fmt.Errorf("no layout for Ruby %d.%d (3.1 and 3.3 are walked): %w", major, minor, errUnsupported)
	}
	return l, nil
}

// bpf is the walker's entry for a process whose ruby_current_ec is at
// tls (from the thread pointer, or in module mod's block when mod != 0).
func (l *layout) bpf(tls int64, mod uint32) bpf.ProfileRubyProc {
	p := bpf.ProfileRubyProc{
		EcTls: tls, CfpSize: l.cfpLen,
		EcVmStack: l.ecVMStack, EcStackLen: l.ecStackLen, EcCfp: l.ecCfp,
		CfpPc: l.cfpPC, CfpIseq: l.cfpIseq, CfpEp: l.cfpEP,
		IseqBody: l.iseqBody, BodyEncoded: l.bodyEncoded,
	}
	if mod != 0 {
		p.TlsDtv, p.TlsModule = 1, mod
	}
	return p
}

// check bounds every offset by what the walker reads.
func (l *layout) check() error {
	cfp := uint16(bpf.ProfileRubyLimitsRUBY_CFP_READ)
	ec := uint16(bpf.ProfileRubyLimitsRUBY_EC_READ)
	switch {
	case l.ecVMStack+8 > ec || l.ecStackLen+8 > ec || l.ecCfp+8 > ec:
		return fmt.Errorf("execution context fields past %d bytes: %w", ec, errLayout)
	case l.cfpLen < 8 || l.cfpLen > cfp || l.cfpPC+8 > l.cfpLen || l.cfpIseq+8 > l.cfpLen || l.cfpEP+8 > l.cfpLen:
		return fmt.Errorf("control frame fields past %d bytes: %w", l.cfpLen, errLayout)
	case l.insnEntry < 4:
		return fmt.Errorf("line table entries of %d bytes: %w", l.insnEntry, errLayout)
	}
	return nil
}
