"""Test oracles for taxmodel and for people extending it: synthetic bundles whose ledger is known
exactly by construction (``synthetic``). Not used by the product itself."""
