/* A pass over the protobuf wire format of a ModelProto that takes the
 * initializers' raw_data out of the message, so protobuf-c's unpack (which
 * copies every bytes field) never duplicates the weights: the caller points
 * each initializer at its bytes where they already lie. */
#ifndef GP_ONNX_WIRE_H
#define GP_ONNX_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where one initializer's raw_data lies in the original bytes (the last
 * occurrence, as protobuf's rules say), or present = false. */
struct gp_raw_ref {
    bool present;
    size_t offset, length;
};

enum gp_wire_result {
    GP_WIRE_STRIPPED, /* *out holds the message without raw_data; refs[i] is initializer i's */
    GP_WIRE_AS_IS,    /* unpack `data` itself: malformed, or laid out as this pass does not
                       * handle (several graph fields, groups); protobuf-c judges it as before */
    GP_WIRE_NOMEM,
};

/* `data`: the serialized ModelProto, `size` bytes. On GP_WIRE_STRIPPED the
 * caller frees *out and *refs; *n_refs counts the graph's initializers in
 * the order protobuf-c unpacks them. */
enum gp_wire_result gp_wire_strip_raw_data(const uint8_t *data, size_t size, uint8_t **out,
                                           size_t *out_size, struct gp_raw_ref **refs,
                                           size_t *n_refs);

#endif
