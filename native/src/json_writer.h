// A small JSON writer for the dump's metadata: commas, quoting and escaping in one place instead of string
// concatenation. Only what metadata needs: objects, arrays, strings, unsigned/signed integers, booleans.
//
//   kvconv::JsonWriter j;
//   j.begin_object().kv("tool", "kvconv-tracer").key("pids").begin_array().value(1).value(2).end_array().end_object();
//   j.str()  ->  {"tool":"kvconv-tracer","pids":[1,2]}
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dump_writer.h"

namespace kvconv {

class JsonWriter {
 public:
  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }
  JsonWriter& key(const std::string& k) {
    comma();
    out_ += '"' + json_escape(k) + "\":";
    after_key_ = true;
    return *this;
  }
  JsonWriter& value(const std::string& s) { return raw('"' + json_escape(s) + '"'); }
  JsonWriter& value(const char* s) { return value(std::string(s ? s : "")); }
  JsonWriter& value(bool b) { return raw(b ? "true" : "false"); }
  JsonWriter& value(uint64_t v) { return raw(std::to_string(v)); }
  JsonWriter& value(int64_t v) { return raw(std::to_string(v)); }
  JsonWriter& value(uint32_t v) { return value(static_cast<uint64_t>(v)); }
  JsonWriter& value(int v) { return value(static_cast<int64_t>(v)); }
  template <typename T>
  JsonWriter& kv(const std::string& k, const T& v) {
    return key(k).value(v);
  }
  JsonWriter& strings(const std::string& k, const std::vector<std::string>& vs) {
    key(k).begin_array();
    for (auto& s : vs) value(s);
    return end_array();
  }
  const std::string& str() const { return out_; }

 private:
  void comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
    }
  }
  JsonWriter& raw(const std::string& s) {
    comma();
    out_ += s;
    return *this;
  }
  JsonWriter& open(char c) {
    comma();
    out_ += c;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& close(char c) {
    out_ += c;
    first_.pop_back();
    return *this;
  }
  std::string out_;
  std::vector<bool> first_;  // per open container: nothing written in it yet
  bool after_key_ = false;
};

}  // namespace kvconv
