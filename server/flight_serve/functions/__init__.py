"""User functions shipped with a pipeline: the contract (:mod:`.base`) and its runners."""
