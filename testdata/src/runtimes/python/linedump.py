# Dumps the line tables of every code object of some modules, with the
# line this interpreter itself gives each instruction, one JSON object a
# line: {"name", "first", "table" (hex: co_lnotab in 3.9, co_linetable
# after), "lines": [line of instruction i]} (3.9: the instruction at byte
# 2*i, by dis.findlinestarts; 3.10: by co_lines; 3.11+: code unit i, by
# co_positions). 0 is "no line".
import dis
import importlib
import json
import sys


def codes(c):
    yield c
    for k in c.co_consts:
        if hasattr(k, "co_code"):
            yield from codes(k)


def dump(c):
    if sys.version_info >= (3, 11):
        table = c.co_linetable
        lines = [p[0] or 0 for p in c.co_positions()]
    elif sys.version_info >= (3, 10):
        table = c.co_linetable
        lines = [0] * (len(c.co_code) // 2)
        for start, end, line in c.co_lines():
            for off in range(start, end, 2):
                lines[off // 2] = line or 0
    else:
        table = c.co_lnotab
        starts = dict(dis.findlinestarts(c))
        lines, line = [], c.co_firstlineno
        for off in range(0, len(c.co_code), 2):
            line = starts.get(off, line)
            lines.append(line)
    return {"name": c.co_name, "first": c.co_firstlineno, "table": table.hex(), "lines": lines}


for name in sys.argv[1:]:
    if name.endswith(".py"):
        with open(name) as f:
            top = compile(f.read(), name, "exec")
    else:
        mod = importlib.import_module(name)
        with open(mod.__file__) as f:
            top = compile(f.read(), mod.__file__, "exec")
    for c in codes(top):
        print(json.dumps(dump(c)))
