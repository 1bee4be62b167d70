"""Data layer: DataProto, the batch container verl ships between driver and workers.

Holds DataProto (TensorDict rows + numpy non-tensors + meta, ``data_proto``) and the helpers behind it: union
rules, TensorDict chunking and numpy transport (``ops``), padding to a divisor (``padding``), and the
names of the fields generation returns (``fields``). May import: the arithmetic layer
(``labkit.config`` … ``labkit.memory``, ``labkit.trace``).
"""
