"""Storage backends: the contract (:mod:`.base`) and its implementations."""
