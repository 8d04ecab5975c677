/*
 * A process that forges Perl's state (internal/host/runtimes/perl
 * TestForgedInterpreter). Installed as "perl" and linked with -rdynamic,
 * it exports what the agent looks for (Perl_runops_standard, PL_curinterp,
 * PL_thr_key, PL_revision, PL_version) with an interpreter laid out as
 * 5.36 lays it out, found through its thread key as a threaded perl's is,
 * and spins in its "run loop". A sane interpreter (no context: the main
 * program only) is there at attach; what it forges a second later, by
 * argv[1]:
 *
 *   (built with -DMINOR=99: PL_version says 5.99, refused at attach)
 *   wild     the context stack is a wild pointer
 *   loop     a sub context whose outer sub index is itself
 *   notcv    a sub context whose CV is no CV (a GV)
 *   names    a sub whose name is 900,000 bytes long and whose file name
 *            and the COP's never end (1 MiB without a NUL); it turns into
 *            a freed CV (no type) two seconds later
 *
 * It spins until killed.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define AT(base, off, type) (*(type *)((char *)(base) + (off)))

#ifndef MINOR
#define MINOR 36
#endif
const unsigned char PL_revision = 5, PL_version = MINOR, PL_subversion = 0;
void *PL_curinterp;
pthread_key_t PL_thr_key;

/* 5.36's layout, as the agent's table has it. */
enum {
	I_OP = 8, I_CURCOP = 208, I_STACKINFO = 224,
	SI_CXSTACK = 8, SI_PREV = 16, SI_CXIX = 32, SI_CXMAX = 36, SI_CXSUBIX = 40, SI_TYPE = 44,
	CX_SIZE = 104, CX_OLDCOP = 16, CX_RETOP = 48, CX_OLDSUBIX = 56, CX_CV = 72,
	XCV_STASH = 32, XCV_GV = 56, XCV_FILE = 64,
	XGV_NAMEHEK = 32, XGV_STASH = 40, HV_AUX = 32,
	COP_LINE = 36, COP_FILE = 48,
};

static char interp[4096], si[64], cxs[4 * CX_SIZE], cop[64], op[64];
static char cv[24], cvbody[128], gv[24], gvbody[64], hv[24], hvbody[128];
static char hek[8 + 900000 + 1], pkg[8 + 8];
static char endless[1 << 20];

static volatile uint64_t sink;

/* The "run loop": where every sample lands. */
__attribute__((noinline)) void Perl_runops_standard(double seconds) /* < 0: forever */
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		for (int i = 0; i < 1000000; i++)
			sink += i * i;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (seconds >= 0 && t.tv_sec - t0.tv_sec + (t.tv_nsec - t0.tv_nsec) / 1e9 > seconds)
			return;
	}
}

static void sv(char *head, void *body, uint32_t flags)
{
	AT(head, 0, void *) = body;
	AT(head, 8, uint32_t) = 1;
	AT(head, 12, uint32_t) = flags;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "wild";

	/* The main program: no context yet. */
	AT(interp, I_OP, void *) = op;
	AT(interp, I_CURCOP, void *) = cop;
	AT(interp, I_STACKINFO, void *) = si;
	AT(si, SI_CXSTACK, void *) = cxs;
	AT(si, SI_CXIX, int32_t) = -1;
	AT(si, SI_CXMAX, int32_t) = 3;
	AT(si, SI_CXSUBIX, int32_t) = -1;
	AT(si, SI_TYPE, int32_t) = 1; /* PERLSI_MAIN */
	AT(cop, COP_LINE, uint32_t) = 7;
	AT(cop, COP_FILE, char *) = "forged.pl";
	PL_curinterp = interp;
	pthread_key_create(&PL_thr_key, 0);
	pthread_key_create(&PL_thr_key, 0); /* key 1: not the first */
	pthread_setspecific(PL_thr_key, interp);
	Perl_runops_standard(1);

	/* A sub context at index 0. */
	AT(cxs, 0, uint8_t) = 9; /* CXt_SUB */
	AT(cxs, CX_OLDCOP, void *) = cop;
	AT(cxs, CX_RETOP, void *) = op;
	AT(cxs, CX_OLDSUBIX, int32_t) = -1;
	AT(cxs, CX_CV, void *) = cv;
	sv(cv, cvbody, 13); /* SVt_PVCV */
	AT(cvbody, XCV_GV, void *) = gv;
	AT(cvbody, XCV_FILE, char *) = "forged.pl";
	sv(gv, gvbody, 9); /* SVt_PVGV */
	AT(gvbody, XGV_NAMEHEK, void *) = hek;
	AT(gvbody, XGV_STASH, void *) = hv;
	sv(hv, hvbody, 12 | 0x02000000); /* SVt_PVHV, SVf_OOK */
	AT(hvbody, HV_AUX, void *) = pkg;
	AT(pkg, 4, int32_t) = 6;
	memcpy(pkg + 8, "Forged", 6);
	AT(hek, 4, int32_t) = 3;
	memcpy(hek + 8, "sub", 3);
	if (!strcmp(mode, "wild")) {
		AT(si, SI_CXSTACK, uint64_t) = 0xdead000000ull;
	} else if (!strcmp(mode, "loop")) {
		AT(cxs, CX_OLDSUBIX, int32_t) = 0;
	} else if (!strcmp(mode, "notcv")) {
		AT(cxs, CX_CV, void *) = gv;
	} else if (!strcmp(mode, "names")) {
		memset(hek + 8, 'n', 900000);
		AT(hek, 4, int32_t) = 900000;
		memset(endless, 'f', sizeof(endless));
		AT(cvbody, XCV_FILE, char *) = endless;
		AT(cop, COP_FILE, char *) = endless;
	}
	AT(si, SI_CXSUBIX, int32_t) = 0;
	AT(si, SI_CXIX, int32_t) = 0;
	if (!strcmp(mode, "names")) {
		Perl_runops_standard(2);
		AT(cv, 12, uint32_t) = 0xff; /* freed: no type */
	}
	Perl_runops_standard(-1);
	return 0;
}
