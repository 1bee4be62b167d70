"""Data layer: DataProto, the batch container verl ships between driver and workers.

Holds DataProto (TensorDict rows + numpy non-tensors + meta, ``data_proto``), its row-level operations (chunk, concat,
repeat, make_iterator: ``rows``) and numpy-only pickling (``transport``), the helpers behind them: auto-padding switch,
union rules and TensorDict chunking (``ops``), padding to a divisor (``padding``), and the names of the fields
generation returns (``fields``). May import: the arithmetic layer (``labkit.config`` … ``labkit.memory``,
``labkit.trace``).
"""
