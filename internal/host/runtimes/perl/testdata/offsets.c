/*
 * Prints the offsets and constants of internal/host/runtimes/perl/layout.go
 * for the Perl whose headers it is compiled against (docs/runtimes.md):
 *
 *   gcc -O2 $(perl -MExtUtils::Embed -e ccopts) offsets.c -o offsets && ./offsets
 *
 * For another Debian release, debootstrap it with libperl-dev and point
 * the -I of the chroot's `perl -MExtUtils::Embed -e ccopts` at its CORE
 * directory (the host's compiler and libc headers do: Perl's structs do
 * not depend on them).
 */
#include <EXTERN.h>
#include <perl.h>
#include <stdio.h>
#include <stddef.h>
#define P(name, expr) printf("%-22s %zu\n", name, (size_t)(expr))
int main(void){
 P("interp_curstackinfo", offsetof(struct interpreter, Icurstackinfo));
 P("interp_curcop", offsetof(struct interpreter, Icurcop));
 P("interp_size", sizeof(struct interpreter));
 P("si_cxstack", offsetof(PERL_SI, si_cxstack));
 P("si_prev", offsetof(PERL_SI, si_prev));
 P("si_cxix", offsetof(PERL_SI, si_cxix));
 P("si_cxmax", offsetof(PERL_SI, si_cxmax));
 P("si_cxsubix", offsetof(PERL_SI, si_cxsubix));
 P("si_type", offsetof(PERL_SI, si_type));
 P("cx_size", sizeof(PERL_CONTEXT));
 P("cx_type", offsetof(PERL_CONTEXT, cx_u.cx_blk.blku_type));
 P("cx_oldcop", offsetof(PERL_CONTEXT, cx_u.cx_blk.blku_oldcop));
 P("cx_retop", offsetof(PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_sub.retop));
 P("cx_oldsubix", offsetof(PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_sub.old_cxsubix));
 P("cx_cv", offsetof(PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_sub.cv));
 P("cx_evalcv", offsetof(PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_eval.cv));
 P("cx_evalcvfmt", offsetof(PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_format.cv));
 P("sv_any", offsetof(SV, sv_any));
 P("sv_refcnt", offsetof(SV, sv_refcnt));
 P("sv_flags", offsetof(SV, sv_flags));
 P("sv_u", offsetof(SV, sv_u));
 P("xcv_stash", offsetof(XPVCV, xcv_stash));
 P("xcv_gv", offsetof(XPVCV, xcv_gv_u));
 P("xcv_file", offsetof(XPVCV, xcv_file));
 P("xcv_flags", offsetof(XPVCV, xcv_flags));
 P("xcv_flags_size", sizeof(((XPVCV*)0)->xcv_flags));
 P("CVf_NAMED", CVf_NAMED);
 P("CVf_ANON", CVf_ANON);
 P("xgv_stash", offsetof(XPVGV, xnv_u.xgv_stash));
 P("xgv_namehek", offsetof(XPVGV, xiv_u.xivu_namehek));
 P("hek_len", offsetof(HEK, hek_len));
 P("hek_key", offsetof(HEK, hek_key));
 P("xhv_max", offsetof(XPVHV, xhv_max));
 P("xhv_aux", offsetof(struct xpvhv_with_aux, xhv_aux));
 P("aux_name", offsetof(struct xpvhv_aux, xhv_name_u));
 P("aux_name_count", offsetof(struct xpvhv_aux, xhv_name_count));
 P("cop_line", offsetof(COP, cop_line));
 P("cop_file", offsetof(COP, cop_file));
 P("SVt_PVCV", SVt_PVCV);
 P("SVt_PVGV", SVt_PVGV);
 P("SVt_PVHV", SVt_PVHV);
 P("SVf_OOK", SVf_OOK);
 P("SVTYPEMASK", SVTYPEMASK);
 P("CXt_SUB", CXt_SUB); P("CXt_FORMAT", CXt_FORMAT); P("CXt_EVAL", CXt_EVAL);
 P("CXp_EVALBLOCK", CXp_EVALBLOCK); P("CXp_TRY", CXp_TRY); P("CXp_REAL", CXp_REAL);
 P("PERLSI_MAIN", PERLSI_MAIN);
 P("interp_op", offsetof(struct interpreter, Iop));
 P("xcv_start", offsetof(XPVCV, xcv_start_u));
 P("OP_NEXTSTATE", OP_NEXTSTATE);
 { OP o; memset(&o, 0, sizeof o); o.op_type = 0x1ff; unsigned short w; memcpy(&w, (char *)&o + 32, 2); P("op_type_word_at_32", w); }
 return 0;
}
