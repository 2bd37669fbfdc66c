# SPDX-License-Identifier: Apache-2.0
"""LLM decoding with the KV cache on targets: the transformers hooks (:mod:`.hooks`), the
target-side store (:mod:`.remote`), the FlexGen-style baseline (:mod:`.flexgen`), and the
``insitu llm`` and ``insitu bench llm`` commands.

Targets often run on the same cores as the model (``insitu llm`` without ``--targets``
embeds them). torch's OpenMP threads otherwise spin for a while after every operation,
taking those cores from the targets' attention threads just when they have work, so,
unless the user chose otherwise, they wait passively. This must be set before torch is
first imported.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
