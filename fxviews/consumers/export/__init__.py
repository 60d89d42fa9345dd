"""Exported programs: ``torch.export`` programs rewritten, and the systems that take them.

Takes an ``ExportedProgram``; gives a new, validated one with every provable ``as_strided``
rewritten (:mod:`.program`, with the layout decisions export already made settled by
:mod:`.decisions`), and the programs handed on: ONNX (:mod:`.onnx`) and ExecuTorch's edge
dialect (:mod:`.executorch`); :mod:`.flat_reads` is the check both make of a kept as_strided.
"""
