"""Device prefetch: the next batch's copy to the device and its normalisation, ahead of the step."""
import functools
from concurrent.futures import ThreadPoolExecutor

import torch

from mobilenet.data.crops import ValCrop

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@functools.lru_cache(maxsize=None)
def copy_stream(device):
    """One side stream per device for the whole run: a prefetcher is made per epoch, and torch_npu
    documents leaked memory when streams are created over and over."""
    return getattr(torch, device.type).Stream(device)


class DevicePrefetcher:
    """Iterates a loader of uint8 batches, copying the next batch to the device and normalising it
    there (float, (x/255 - mean)/std, optional channels_last) while the current one trains: on a
    side stream on cuda and npu, so that the copy overlaps the compute; in order on cpu.
    ``decode_on_device``: the loader's batches hold JPEGs still encoded (data.decode=device),
    decoded and cropped on the device first (mobilenet.data.device_decode)."""

    def __init__(self, loader, device, channels_last=False, dtype=torch.float32, decode_on_device=False):
        self.loader, self.device = loader, device
        self.decoder = None  # data.decode=device: the loader's batches are EncodedBatches
        if decode_on_device:
            from mobilenet.data.device_decode import DeviceDecoder  # imported only then
            crop = loader.dataset.transform.crop  # a ScreenedCrop's TrainCrop or ValCrop
            self.decoder = DeviceDecoder(loader.dataset, device, crop.size, crop if isinstance(crop, ValCrop) else None)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.dtype = dtype
        mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
        std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255
        self.scale, self.shift = 1 / std, -mean / std  # (x - mean) / std = x * scale + shift
        # torch.cuda and torch.npu (torch_npu) share the stream API used here
        self.streams = getattr(torch, device.type) if device.type in ("cuda", "npu") else None
        self.side_stream = copy_stream(device) if self.streams else None

    def __len__(self):
        return len(self.loader)

    def _to_device(self, batch):
        """Two passes on the device: the uint8 batch into the layout, then one fp32 multiply-add
        written in the step's dtype (the same values as float, subtract, divide and cast)."""
        if self.decoder is not None:  # an EncodedBatch: decoded and cropped on the device
            images, labels = self.decoder(batch)
        else:
            images, labels = batch
        images = images.to(self.device, non_blocking=True).contiguous(memory_format=self.memory_format)
        normalised = torch.empty(images.shape, dtype=self.dtype, device=self.device,
                                 memory_format=self.memory_format)
        torch.addcmul(self.shift, images, self.scale, out=normalised)
        return normalised, labels.to(self.device, non_blocking=True)

    def _start(self, batch):
        """Queues ``batch``'s copy and normalisation (on the side stream where there is one)."""
        if batch is None:
            return None
        if self.side_stream is None:
            return self._to_device(batch)
        with self.streams.stream(self.side_stream):
            return self._to_device(batch)

    def _ready(self, batch):
        """Makes the compute stream wait for what the side stream has queued so far (this batch)
        and keeps the batch's memory from reuse until the compute stream is done with it."""
        if self.side_stream is not None:
            compute = self.streams.current_stream(self.device)
            compute.wait_stream(self.side_stream)
            for tensor in batch:
                tensor.record_stream(compute)
        return batch

    def __iter__(self):
        if self.side_stream is not None:  # scale and shift were made on the compute stream
            self.side_stream.wait_stream(self.streams.current_stream(self.device))
        iterator = iter(self.loader)
        if self.decoder is not None:
            yield from self.decoded(iterator)
            return
        upcoming = self._start(next(iterator, None))
        while upcoming is not None:
            current = self._ready(upcoming)  # before the next batch is queued behind it
            upcoming = self._start(next(iterator, None))
            yield current

    def decoded(self, iterator):
        """As __iter__, with the next batch's decode, crops and normalisation in a host thread of
        its own (decode_jpeg blocks the thread that calls it until its batch is done), its work
        queued on the side stream there (a thread's current stream is its own)."""
        with ThreadPoolExecutor(1, thread_name_prefix="device-decode") as thread:
            upcoming = thread.submit(self._start, next(iterator, None))
            while (batch := upcoming.result()) is not None:
                current = self._ready(batch)
                upcoming = thread.submit(self._start, next(iterator, None))
                yield current
