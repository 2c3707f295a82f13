"""verifiers (v1) environments written for the tests: a single-turn one (:mod:`.single`),
a multi-turn one (:mod:`.multi`), one with a tool (:mod:`.tools`) and broken ones
(:mod:`.broken`); their datasets are built here, nothing is downloaded."""
