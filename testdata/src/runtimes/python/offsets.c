/*
 * How the 3.9-3.12 offsets of internal/host/runtimes/cpython/layout.go were
 * derived: compiled against a version's headers (Debian's libpython3.X-dev,
 * or a pyenv build's include/), it prints the offsets the walker and the
 * namer use. Not built by the tests; rerun it for a new minor version:
 *
 *   gcc -I$INC -I$INC/python3.X -o offsets offsets.c && ./offsets
 */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <frameobject.h>
#include <stddef.h>
#include <stdio.h>
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#endif
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_code.h"
#define P(n, e) printf("%-40s %4zu\n", n, (size_t)(e))
int main(void) {
	printf("version %s\n", PY_VERSION);
	P("runtime.interpreters.head", offsetof(_PyRuntimeState, interpreters.head));
	P("runtime.interpreters.main", offsetof(_PyRuntimeState, interpreters.main));
#if PY_VERSION_HEX >= 0x030B0000
	P("interp.threads.head", offsetof(PyInterpreterState, threads.head));
#else
	P("interp.tstate_head", offsetof(PyInterpreterState, tstate_head));
#endif
	P("interp.next", offsetof(PyInterpreterState, next));
	P("tstate.prev", offsetof(PyThreadState, prev));
	P("tstate.next", offsetof(PyThreadState, next));
	P("tstate.interp", offsetof(PyThreadState, interp));
#if PY_VERSION_HEX >= 0x030D0000
	P("tstate.current_frame", offsetof(PyThreadState, current_frame));
#elif PY_VERSION_HEX >= 0x030B0000
	P("tstate.cframe", offsetof(PyThreadState, cframe));
	P("cframe.current_frame", offsetof(_PyCFrame, current_frame));
#else
	P("tstate.frame", offsetof(PyThreadState, frame));
#endif
	P("tstate.thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX >= 0x030B0000
	P("tstate.native_thread_id", offsetof(PyThreadState, native_thread_id));
#endif
#if PY_VERSION_HEX >= 0x030B0000
#if PY_VERSION_HEX >= 0x030D0000
	P("iframe.f_executable", offsetof(_PyInterpreterFrame, f_executable));
	P("iframe.instr_ptr", offsetof(_PyInterpreterFrame, instr_ptr));
#else
	P("iframe.f_code", offsetof(_PyInterpreterFrame, f_code));
	P("iframe.prev_instr", offsetof(_PyInterpreterFrame, prev_instr));
#endif
	P("iframe.previous", offsetof(_PyInterpreterFrame, previous));
	P("iframe.owner", offsetof(_PyInterpreterFrame, owner));
#if PY_VERSION_HEX < 0x030C0000
	P("iframe.is_entry", offsetof(_PyInterpreterFrame, is_entry));
#endif
	P("code.co_code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
	P("code.co_qualname", offsetof(PyCodeObject, co_qualname));
	P("code.co_linetable", offsetof(PyCodeObject, co_linetable));
#if PY_VERSION_HEX >= 0x030C0000
	P("FRAME_OWNED_BY_CSTACK", FRAME_OWNED_BY_CSTACK);
#endif
#else
	P("frame.f_back", offsetof(PyFrameObject, f_back));
	P("frame.f_code", offsetof(PyFrameObject, f_code));
	P("frame.f_lasti", offsetof(PyFrameObject, f_lasti));
#endif
	P("code.co_filename", offsetof(PyCodeObject, co_filename));
	P("code.co_name", offsetof(PyCodeObject, co_name));
	P("code.co_firstlineno", offsetof(PyCodeObject, co_firstlineno));
	P("code.co_flags", offsetof(PyCodeObject, co_flags));
	P("code.co_argcount", offsetof(PyCodeObject, co_argcount));
	P("sizeof code", sizeof(PyCodeObject));
	P("unicode ascii data", sizeof(PyASCIIObject));
	P("unicode compact data", sizeof(PyCompactUnicodeObject));
	P("bytes ob_sval", offsetof(PyBytesObject, ob_sval));
	P("type tp_members", offsetof(PyTypeObject, tp_members));
	P("type tp_basicsize", offsetof(PyTypeObject, tp_basicsize));
	P("type tp_name", offsetof(PyTypeObject, tp_name));
	P("type tp_flags", offsetof(PyTypeObject, tp_flags));
	return 0;
}
