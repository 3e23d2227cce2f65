"""The sharing strategies, one module each (:mod:`.exclusive`, :mod:`.timeslicing`, :mod:`.mps`,
:mod:`.limits`), what each must provide (:mod:`.base`) and the registry that names them
(:mod:`.registry`). The enforcer reaches a strategy only through the registry."""
