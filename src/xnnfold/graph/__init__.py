"""What the steps of the pass share to read and build graphs, written once:

- :mod:`.node_meta` — a node's fake tensor value;
- :mod:`.program_copy` — a program copied (graph and signature; tensors shared);
- :mod:`.validity` — a step's program checked by torch's verifier, output specs kept in sync;
- :mod:`.constants` — a new lifted constant placed in a program;
- :mod:`.emit` — nodes created with their fake values and provenance; XNNPACK's reshapes;
- :mod:`.sdpa` — SDPA's arguments and the masked-row handling of a rewritten attention;
- :mod:`.values` — which nodes hold the same value; repeated computations merged.
"""
