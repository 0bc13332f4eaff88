"""heart-distill's face: the ``heart`` command and the pipeline, which may import every part.

The parts live in the repository's top-level folders and install under this namespace:
``heart`` (what runs at inference: the loop, roles, ToolFace, runtime, environments) stays a
package of its own and imports nothing from here; ``data/`` installs as
``heart_distill.data``, ``train/`` as ``heart_distill.train`` and ``eval/`` as
``heart_distill.eval``, so that nothing named plainly ``data``, ``train`` or ``eval`` lands in
site-packages.
"""
