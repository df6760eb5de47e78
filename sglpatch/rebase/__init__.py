"""Rebasing the series onto an sglang release that is not pinned (``sglpatch rebase <version>``):
``onto.rebase_onto`` walks it (its docstring tells the whole cascade), ``trial`` and ``patch`` port
one patch, ``merge_tools`` propose trees, ``judge`` accepts or refuses them, ``report`` says what
became of each patch, ``hand_port`` prepares what a person must finish, ``new_pin`` pins the
release, ``tidy`` and ``redundant`` keep the renditions few, ``leave_one_out`` ports onto a copy
of the project that never saw a pinned release."""
