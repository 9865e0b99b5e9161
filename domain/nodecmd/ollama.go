package nodecmd

import "time"

// The ollama.* command family an ollama adapter serves. Results are
// Ollama's own JSON, passed on unchanged (an empty success body is
// {"status":"success"}); the types below are the parts of them iop reads,
// so decoding ignores the rest.
const (
	CmdOllamaVersion = "ollama.version" // GET /api/version → OllamaVersion
	CmdOllamaList    = "ollama.list"    // GET /api/tags → OllamaModelList
	CmdOllamaPS      = "ollama.ps"      // GET /api/ps → OllamaRunningList
	CmdOllamaShow    = "ollama.show"    // POST /api/show → OllamaShow
	CmdOllamaPull    = "ollama.pull"    // POST /api/pull, streamed: OllamaPullProgress lines, then OllamaStatus
	CmdOllamaDelete  = "ollama.delete"  // DELETE /api/delete → OllamaStatus
	CmdOllamaCopy    = "ollama.copy"    // POST /api/copy → OllamaStatus
)

// OllamaCommands lists the ollama.* family in documentation order.
var OllamaCommands = []string{CmdOllamaVersion, CmdOllamaList, CmdOllamaPS, CmdOllamaShow, CmdOllamaPull, CmdOllamaDelete, CmdOllamaCopy}

// OllamaArgs are the arguments of the ollama.* commands. The Selector
// (an ollama adapter, or an Ollama declared only as a provider) picks which
// Ollama of the node answers; every other key reaches Ollama as is. show, pull and delete need Model; copy needs Source and
// Destination.
type OllamaArgs struct {
	Model       string `json:"model,omitempty"`
	Source      string `json:"source,omitempty"`
	Destination string `json:"destination,omitempty"`
	Selector
}

// OllamaVersion answers ollama.version.
type OllamaVersion struct {
	Version string `json:"version"`
}

// OllamaModelList answers ollama.list.
type OllamaModelList struct {
	Models []OllamaModel `json:"models"`
}

// OllamaModel is one model Ollama has.
type OllamaModel struct {
	Name       string        `json:"name"`
	Model      string        `json:"model"`
	Size       int64         `json:"size"`
	Digest     string        `json:"digest"`
	ModifiedAt time.Time     `json:"modified_at"`
	Details    OllamaDetails `json:"details"`
}

// OllamaDetails describes a model's weights.
type OllamaDetails struct {
	Format            string `json:"format"`
	Family            string `json:"family"`
	ParameterSize     string `json:"parameter_size"`
	QuantizationLevel string `json:"quantization_level"`
}

// OllamaRunningList answers ollama.ps.
type OllamaRunningList struct {
	Models []OllamaRunningModel `json:"models"`
}

// OllamaRunningModel is one model loaded in Ollama.
type OllamaRunningModel struct {
	Name      string    `json:"name"`
	Model     string    `json:"model"`
	Size      int64     `json:"size"`
	SizeVRAM  int64     `json:"size_vram"`
	ExpiresAt time.Time `json:"expires_at"`
}

// OllamaShow answers ollama.show.
type OllamaShow struct {
	Details      OllamaDetails `json:"details"`
	Capabilities []string      `json:"capabilities"`
}

// OllamaStatus answers ollama.pull, ollama.delete and ollama.copy.
type OllamaStatus struct {
	Status string `json:"status"`
}

// OllamaPullProgress is one progress report of ollama.pull: a status line,
// a layer's download (Digest, Total, Completed) or an Error.
type OllamaPullProgress struct {
	Status    string `json:"status"`
	Digest    string `json:"digest"`
	Total     int64  `json:"total"`
	Completed int64  `json:"completed"`
	Error     string `json:"error"`
}
