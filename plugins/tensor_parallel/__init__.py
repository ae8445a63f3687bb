"""Tensor parallel across processes: sharded loading, rendezvous, launch and lockstep."""
