"""A stand-in for librepro_cuda_hash.so over host memory, so that the recorder's flushing, holding
and checking (`repro.torch.cuda_hash.DeviceHasher`, `repro.torch.flushes`) run in CPU tests.

It keeps the library's contract: a flush reads the memory at once, as the GPU reads it before
anything the program queues later. A program that changed the memory between its queueing and
the flush gets another hash, unless the recorder caught the change first."""

import ctypes
from collections import Counter

from repro.trace import BLAKE3, XXH3_1K, data_hasher


class CpuHashLibrary:
    """The library's C functions, by the same names, over host addresses."""

    def __init__(self):
        self.kind = self.hash_data = None  # the data hash and its function, once a hasher is made
        self.pushed = []  # (ticket, address, length, keep) queued and not flushed
        self.results = {}  # ticket -> (hash, kept bytes or None), of everything read
        self.read_now = 0  # pieces `push_now` read
        self.tickets = 0
        self.flushes = 0
        self.reads = Counter()  # how many times each address was read

    def repro_cuda_hasher_new(self, index):
        self.kind, self.hash_data = BLAKE3, data_hasher(BLAKE3)
        return 1

    def repro_cuda_hasher_new_kind(self, index, number):
        from repro.torch.cuda_hash import LIBRARY_DATA_HASHES

        self.kind = next(k for k, n in LIBRARY_DATA_HASHES.items() if n == number)
        self.hash_data = data_hasher(self.kind)
        return 1

    def repro_cuda_hasher_push_many(self, handle, addresses, lengths, keeps, n):
        first = self.tickets
        self.pushed.extend((first + i, addresses[i], lengths[i], keeps[i]) for i in range(n))
        self.tickets += n
        return first

    def repro_cuda_hasher_push_now(self, handle, address, length):
        """Reads at once (the library's leaf pass runs now), the hash landing in ticket order."""
        if self.kind != XXH3_1K:
            return -1
        ticket, self.tickets = self.tickets, self.tickets + 1
        self._read([(ticket, address, length, 0)])
        self.read_now += 1
        return ticket

    def _read(self, pieces):
        for ticket, address, length, keep in pieces:
            self.reads[address] += 1
            data = ctypes.string_at(address, length)
            self.results[ticket] = (self.hash_data(data), data if keep else None)

    def repro_cuda_hasher_flush(self, handle):
        self.flushes += 1
        self._read(self.pushed)
        self.pushed = []
        return 0

    def repro_cuda_hasher_start_read(self, handle, n):
        self._read(self.pushed)
        self.pushed = []
        results = [self.results[ticket] for ticket in range(self.tickets)]
        self.results = {}
        n._obj.value = len(results)
        self.tickets = 0
        return results

    def repro_cuda_read_finish(self, read, hashes, n, values, kept):
        at = 0
        for i, (digest, data) in enumerate(read):
            ctypes.memmove(ctypes.addressof(hashes) + 32 * i, digest, 32)
            if data is not None:
                ctypes.memmove(ctypes.addressof(values) + at, data, len(data))
                at += len(data)
        return 0

    def repro_cuda_hasher_free(self, handle):
        pass

    def repro_cuda_last_error(self):
        return b"the CPU stand-in failed"


def hash_on_cpu_stand_in(recorder):
    """Makes `recorder` hash every tensor, CPU ones included, through a `DeviceHasher` over the
    stand-in library; returns the stand-in."""
    from repro.torch.cuda_hash import DeviceHasher

    class CpuDeviceHasher(DeviceHasher):
        def _is_legacy_stream(self):
            return True

    library = CpuHashLibrary()
    hasher = CpuDeviceHasher("", 0, lib=library, data_hash=recorder.data_hash)
    recorder.hashers[0] = hasher
    recorder.hasher_for = lambda t: hasher
    return library
