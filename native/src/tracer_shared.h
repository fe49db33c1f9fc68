// Shared between the host tracer (tracer.cpp) and the device patch (patch.cu): the per-context device state and
// how the 64-bit callback-data value is encoded.
//
// userdata = state_address | (kernel_slot << KVCONV_SLOT_SHIFT) | (tag & KVCONV_TAG_MASK)
//   state_address: the context's kvconv_dev_state, aligned to 2^KVCONV_TAG_BITS inside one device allocation;
//   kernel_slot:   stable kernel-table slot of a target function (bits 48..63; device addresses fit in 48 bits);
//   tag:           per-replay tag (the graph launch id), 0 for eager launches and function-level data.
// Only the state address is ever dereferenced; the other bits are values, never memory.
// A NULL userdata means "not a target" (non-target functions of a patched module): the patch returns at once.
#pragma once
#include <stdint.h>

#define KVCONV_TAG_BITS 20
#define KVCONV_TAG_MASK ((1ull << KVCONV_TAG_BITS) - 1ull)
#define KVCONV_SLOT_SHIFT 48
#define KVCONV_STATE_MASK (((1ull << KVCONV_SLOT_SHIFT) - 1ull) & ~KVCONV_TAG_MASK)
#define KVCONV_STATE_ALIGN (1ull << KVCONV_TAG_BITS)
#define KVCONV_EVENTS_OFFSET 256ull  // events start this far after the state (64-byte records stay 64-aligned)

struct kvconv_dev_state {
  unsigned long long events;    // device address of kvconv_device_event_t[capacity]
  unsigned long long capacity;  // records
  unsigned long long next;      // slot counter: one atomicAdd per recorded block
  unsigned long long drops;     // blocks that found the buffer full (never waited on)
  unsigned long long reserved[3];
  unsigned long long writes;    // device address of kvconv_writes_state (writes_shared.h); 0: write recording off
};
