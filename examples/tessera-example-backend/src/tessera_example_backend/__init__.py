"""An example third-party tessera plugin package.

Two plugins, each its own entry point in the ``tessera`` group (see pyproject.toml):

- ``example-backend`` (:mod:`.backend`): the ``example`` backend, numpy in float32, which
  implements the core ops but declines normal-mode RoPE and grouped-query attention, so
  tessera chooses another backend for models that need them; plus a weight kernel that
  keeps ``EX_I8`` weights as int8 codes.
- ``example-quant`` (:mod:`.quant`): ``EX_I8``, an 8-bit absmax quant type.
"""
