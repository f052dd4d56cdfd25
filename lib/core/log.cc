#include "lib/core/log.h"

#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace shoal {
namespace {

// Writes the log message as a JSON string literal (quoted and escaped), so that messages
// containing quotes or control characters still make valid JSON lines.
class JsonMessageFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    std::string quoted = nlohmann::json(std::string(msg.payload.data(), msg.payload.size()))
                             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    dest.append(quoted.data(), quoted.data() + quoted.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
};

}  // namespace

void InitLogging(std::string_view format, std::string_view level, std::string_view component) {
  auto logger = std::make_shared<spdlog::logger>(
      std::string(component), std::make_shared<spdlog::sinks::stderr_sink_mt>());
  if (format == "text") {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%n] %v");
  } else {
    auto f = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    f->add_flag<JsonMessageFlag>('*').set_pattern(
        R"({"ts":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","component":"%n","msg":%*})");
    logger->set_formatter(std::move(f));
  }
  auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") lvl = spdlog::level::info;
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace shoal
