"""Rewrites: the engine's passes, each a torch.fx pass returning one record per node it handled.

:class:`~.as_strided_to_views.AsStridedToViews` (with :mod:`.scatter` and
:mod:`.bounded_reads` for its special patterns), :class:`~.view_to_reshape.ViewToReshape`,
:class:`~.pinning.LayoutPinning`, :class:`~.overwritten_clones.OverwrittenClones`,
:class:`~.unfold_copies.UnfoldCopies`, the guards of kept nodes under vmap
(:mod:`.vmap_guards`) and :mod:`.hygiene`; :class:`~.pass_base.RecordingPass` is their
contract. Takes a GraphModule; gives it rewritten in place with a
:class:`~fxviews.passes.schema.RecordedPassResult`. It imports analysis, chains, geometry, the
engine's shared modules and compat.
"""
