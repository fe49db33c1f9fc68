// Shared between the host tracer (tracer.cpp) and the device patch (patch.cu): the per-context device state and
// how the 64-bit callback-data value is encoded.
//
// userdata = state_address | (kernel_slot << KVCONV_SLOT_SHIFT) | (tag & KVCONV_TAG_MASK)
//   state_address: the context's kvconv_dev_state, aligned to 2^KVCONV_TAG_BITS inside one device allocation;
//   kernel_slot:   stable kernel-table slot of a target function (bits 48..63; device addresses fit in 48 bits);
//   tag:           per-replay tag (the graph launch id), 0 for eager launches and function-level data.
// Only the state address is ever dereferenced; the other bits are values, never memory.
// A NULL userdata means "not a target" (non-target functions of a patched module): the patch returns at once.
//
// The replay tag of a graph exec whose nodes are learned (graph_exec.cpp) does not come through userdata: the host
// writes it once per graph launch into the exec's tag cell, on the launch stream (so before the replay's kernels run),
// and the patch finds the cell from %gridid (constant across replays of one exec) in the node table: open addressing,
// key gridid, slot (gridid + i) & table_mask for i < KVCONV_TABLE_PROBES, an empty slot (gridid 0) ends the search.
// A table hit whose cell holds 0 (not written yet, or the exec is being relearned) falls back to userdata's tag.
#pragma once
#include <stddef.h>
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
  unsigned long long table;     // device address of kvconv_node_entry[table_mask + 1] (0: no node table)
  unsigned long long table_mask;
  unsigned long long cells;     // device address of the graph execs' tag cells (unsigned long long each)
  unsigned long long writes;    // device address of kvconv_writes_state (writes_shared.h); 0: write recording off
  unsigned long long drops_graph;  // of `drops`, the blocks of graph nodes (a replay tag): eager = drops - drops_graph
  unsigned long long flags;        // KVCONV_STATE_*: set once, before the first patched launch
};

// A capture range is configured (KVCONV_CAPTURE_RANGE): a tag cell may say KVCONV_CELL_OFF, so the patch must read
// the tag before it takes a slot. Without it no replay is ever skipped, and the patch takes its slot while the tag
// lookup is still in flight (one dependent memory round trip less before the record's store).
#define KVCONV_STATE_RANGED 1ull

// The patch reads the state as 16-byte pairs (patch.cu kv_record): these fields must stay where they are.
static_assert(offsetof(kvconv_dev_state, events) == 0 && offsetof(kvconv_dev_state, capacity) == 8,
              "patch.cu loads {events, capacity} as one 16-byte pair");
static_assert(offsetof(kvconv_dev_state, table) == 32 && offsetof(kvconv_dev_state, table_mask) == 40,
              "patch.cu loads {table, table_mask} as one 16-byte pair");
static_assert(offsetof(kvconv_dev_state, cells) == 48 && offsetof(kvconv_dev_state, writes) == 56,
              "patch.cu loads {cells, writes} as one 16-byte pair");
static_assert(offsetof(kvconv_dev_state, flags) == 72, "patch.cu loads {drops_graph, flags} as one 16-byte pair");
static_assert(sizeof(kvconv_dev_state) <= KVCONV_EVENTS_OFFSET, "the state must end before the events");

// A tag cell holding this bit: the exec's replay runs outside the capture range (capture_range.cpp). The patch then
// records nothing for its target nodes (no event, no slot write), as the host records nothing for them.
#define KVCONV_CELL_OFF (1ull << 63)
#define KVCONV_TAG_OFF (~0ull)  // what the patch's tag lookup returns for such a node

// One target graph node: its %gridid and the index of its exec's tag cell.
struct kvconv_node_entry {
  unsigned long long gridid;  // 0: empty slot
  unsigned long long cell;
};
static_assert(sizeof(kvconv_node_entry) == 16, "patch.cu loads an entry as one 16-byte pair");

#define KVCONV_TABLE_PROBES 16
