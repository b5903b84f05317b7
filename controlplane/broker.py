"""The embedded default broker (`filesystem://`, folders under `var/broker`), with messages
written atomically.

kombu's filesystem transport creates a message file and then writes it, so a worker polling
the folder from another process can take the file in between and read nothing — the worker
dies on the empty JSON. Here a message is written under a name no queue matches and renamed
into place when complete (a rename is atomic): a consumer sees whole messages or none. With
the control loop and the operations on separate workers (`controlplane.operations.workers`)
two processes poll the folder all the time, besides every process that sends.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f"partial-{name}.tmp")
        try:
            with open(partial, "wb") as out:
                out.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
