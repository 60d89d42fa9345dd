"""The compat layer: every private PyTorch name the engine and the front door use, in one place.

:mod:`.torch_internals` binds or resolves each private name (with what it is for and since
which release) and is the only module outside this package that code imports them from;
:mod:`.older_releases` gives what changed form in torch 2.13 the same behaviour on 2.11 and
2.12; :mod:`.fake_modes` runs an op on values real-mode make_fx gave separate fake modes.
It imports nothing of fxviews: every other package stands on it.
"""
