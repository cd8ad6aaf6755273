"""Watch mode inside the trainers people use: ``dtypecheck.integrations.hf`` (a ``transformers.TrainerCallback``)
and ``dtypecheck.integrations.lightning`` (a Lightning ``Callback``). Each module imports its framework, so import
the one you use (``pip install dtypecheck[hf]`` or ``dtypecheck[lightning]``)."""
