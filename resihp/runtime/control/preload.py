"""The last module a node's forkserver preloads (`agent.MEMBER_PRELOAD`): it freezes the objects
preloaded before it (torch and the member's modules, millions) out of the garbage collector.

Every member forked from the forkserver inherits them frozen (`member_main` freezes again, for its
own imports), so a full collection never holds a member's GIL for long (its heartbeat thread needs
it). The forkserver itself exits through the interpreter's teardown when its agent is gone; with
the objects unfrozen its final collection kept it running, and holding the terminal, for 2-3 s
after the job had ended.
"""

import gc

gc.freeze()
