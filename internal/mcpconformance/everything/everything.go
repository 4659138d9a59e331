// Package everything runs an MCP server, built with the official Go SDK, that offers every tool,
// resource and prompt the official conformance suite's server scenarios
// (@modelcontextprotocol/conformance 0.1.16) call: the "everything" server that the suite's npm
// package does not ship. tether's tests run the suite against it directly and through tether.
//
// Server-to-client requests (sampling, elicitation) and notifications (logging, progress) are
// sent with the tool call's own context, so the SDK writes them on the call's own response
// stream: a server that sent them on the separate GET stream would lose them whenever a proxy
// delivers the call before the GET (the suite's issue #407).
package everything

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// InstanceHeader is the response header naming the replica; every response carries it.
const InstanceHeader = "X-Instance"

// png is a 1×1 PNG and wav a minimal WAV file, as the scenarios expect them.
var (
	png = mustBase64("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")
	wav = mustBase64("UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=")
)

func mustBase64(s string) []byte {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		panic(err) // constant input
	}
	return b
}

// Server is one running everything replica serving Streamable HTTP at /mcp and /healthz. Its
// session ids start with its name. Its methods are safe for concurrent use.
type Server struct {
	// Name names the replica (InstanceHeader, session-id prefix).
	Name string
	// Addr is host:port of the listener.
	Addr string

	srv  *http.Server
	mu   sync.Mutex
	subs map[string]bool
}

// Start runs a replica named name on a free loopback port until ctx ends or Close is called.
func Start(ctx context.Context, name string) (*Server, error) {
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s := &Server{Name: name, Addr: lis.Addr().String(), subs: map[string]bool{}}
	mcpSrv := s.newMCPServer()
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcpSrv },
		&mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	s.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(InstanceHeader, name)
			mux.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = s.srv.Serve(lis) }()
	go func() {
		<-ctx.Done()
		_ = s.Close()
	}()
	return s, nil
}

// URL is the replica's MCP endpoint.
func (s *Server) URL() string { return "http://" + s.Addr + "/mcp" }

// Close stops the replica.
func (s *Server) Close() error {
	if err := s.srv.Close(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("close %s: %w", s.Name, err)
	}
	return nil
}

// Subscribed reports whether some session is subscribed to uri.
func (s *Server) Subscribed(uri string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subs[uri]
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// emptyObject is the input schema of tools without arguments.
var emptyObject = json.RawMessage(`{"type":"object","properties":{}}`)

func (s *Server) newMCPServer() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "tether-conformance-everything", Version: "1.0.0"}, &mcp.ServerOptions{
		GetSessionID: func() string { return s.Name + "-" + rand.Text() },
		Capabilities: &mcp.ServerCapabilities{
			Logging:     &mcp.LoggingCapabilities{}, //nolint:staticcheck // the scenarios test logging
			Completions: &mcp.CompletionCapabilities{},
			Tools:       &mcp.ToolCapabilities{ListChanged: true},
			Prompts:     &mcp.PromptCapabilities{ListChanged: true},
			Resources:   &mcp.ResourceCapabilities{ListChanged: true, Subscribe: true},
		},
		CompletionHandler: func(context.Context, *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
			return &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{}}}, nil
		},
		SubscribeHandler: func(_ context.Context, req *mcp.SubscribeRequest) error {
			s.mu.Lock()
			s.subs[req.Params.URI] = true
			s.mu.Unlock()
			return nil
		},
		UnsubscribeHandler: func(_ context.Context, req *mcp.UnsubscribeRequest) error {
			s.mu.Lock()
			delete(s.subs, req.Params.URI)
			s.mu.Unlock()
			return nil
		},
	})
	s.addTools(srv)
	s.addResources(srv)
	s.addPrompts(srv)
	return srv
}

func tool(name, desc string, schema any) *mcp.Tool {
	if schema == nil {
		schema = emptyObject
	}
	return &mcp.Tool{Name: name, Description: desc, InputSchema: schema}
}

func (s *Server) addTools(srv *mcp.Server) {
	add := func(name, desc string, schema any, h mcp.ToolHandler) { srv.AddTool(tool(name, desc, schema), h) }
	add("test_simple_text", "simple text content", nil, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return text("This is a simple text response for testing."), nil
	})
	add("test_image_content", "image content", nil, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.ImageContent{Data: png, MIMEType: "image/png"}}}, nil
	})
	add("test_audio_content", "audio content", nil, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.AudioContent{Data: wav, MIMEType: "audio/wav"}}}, nil
	})
	add("test_embedded_resource", "embedded resource content", nil, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{
			URI: "test://embedded-resource", MIMEType: "text/plain", Text: "This is an embedded resource content."}}}}, nil
	})
	add("test_multiple_content_types", "text, image and resource content", nil, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: "Multiple content types test:"},
			&mcp.ImageContent{Data: png, MIMEType: "image/png"},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{
				URI: "test://mixed-content-resource", MIMEType: "application/json", Text: `{"test":"data","value":123}`}},
		}}, nil
	})
	add("test_tool_with_logging", "emits log messages while it runs", nil, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		for _, msg := range []string{"Tool execution started", "Tool processing data", "Tool execution completed"} {
			if err := notify(ctx, req.Session, "notifications/message", map[string]any{"level": "info", "data": msg}); err != nil {
				return nil, err
			}
		}
		return text("Tool with logging executed successfully"), nil
	})
	add("test_tool_with_progress", "reports progress", nil, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		token := req.Params.GetProgressToken()
		for _, p := range []float64{0, 50, 100} {
			if token == nil {
				break
			}
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: token, Progress: p, Total: 100, Message: fmt.Sprintf("Completed step %v of 100", p)}); err != nil {
				return nil, fmt.Errorf("progress: %w", err)
			}
		}
		return text(fmt.Sprint(token)), nil
	})
	add("test_error_handling", "always fails", nil, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res := text("This tool intentionally returns an error for testing")
		res.IsError = true
		return res, nil
	})
	add("test_reconnection", "closes its response stream mid-call; the client resumes it (SEP-1699)", nil,
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if req.Extra != nil && req.Extra.CloseSSEStream != nil {
				req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: 100 * time.Millisecond})
			}
			select {
			case <-time.After(200 * time.Millisecond): // the client reconnects meanwhile
			case <-ctx.Done():
				return nil, fmt.Errorf("reconnection: %w", ctx.Err())
			}
			return text("Reconnection test completed successfully. If you received this, the client properly reconnected after stream closure."), nil
		})
	add("test_sampling", "asks the client for an LLM completion",
		json.RawMessage(`{"type":"object","properties":{"prompt":{"type":"string"}},"required":["prompt"]}`),
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var args struct {
				Prompt string `json:"prompt"`
			}
			if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
				return nil, fmt.Errorf("arguments: %w", err)
			}
			res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{ //nolint:staticcheck // the scenario tests sampling
				Messages:  []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: args.Prompt}}}, //nolint:staticcheck // the scenario tests sampling
				MaxTokens: 100,
			})
			if err != nil {
				return text("Sampling not supported or error: " + err.Error()), nil
			}
			reply := "No response"
			if t, ok := res.Content.(*mcp.TextContent); ok {
				reply = t.Text
			}
			return text("LLM response: " + reply), nil
		})
	elicit := func(name, message string, schema string) {
		add(name, "asks the client for input", nil, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			msg := message
			if msg == "" {
				var args struct {
					Message string `json:"message"`
				}
				_ = json.Unmarshal(req.Params.Arguments, &args)
				msg = args.Message
			}
			res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Mode: "form", Message: msg, RequestedSchema: json.RawMessage(schema)})
			if err != nil {
				return text("Elicitation not supported or error: " + err.Error()), nil
			}
			content, _ := json.Marshal(res.Content)
			return text(fmt.Sprintf("Elicitation completed: action=%s, content=%s", res.Action, content)), nil
		})
	}
	elicit("test_elicitation", "",
		`{"type":"object","properties":{"response":{"type":"string","description":"User's response"}},"required":["response"]}`)
	elicit("test_elicitation_sep1034_defaults", "Please review and update the form fields with defaults",
		`{"type":"object","properties":{
		  "name":{"type":"string","description":"User name","default":"John Doe"},
		  "age":{"type":"integer","description":"User age","default":30},
		  "score":{"type":"number","description":"User score","default":95.5},
		  "status":{"type":"string","description":"User status","enum":["active","inactive","pending"],"default":"active"},
		  "verified":{"type":"boolean","description":"Verification status","default":true}},"required":[]}`)
	elicit("test_elicitation_sep1330_enums", "Please select options from the enum fields",
		`{"type":"object","properties":{
		  "untitledSingle":{"type":"string","description":"Select one option","enum":["option1","option2","option3"]},
		  "titledSingle":{"type":"string","description":"Select one option with titles","oneOf":[
		    {"const":"value1","title":"First Option"},{"const":"value2","title":"Second Option"},{"const":"value3","title":"Third Option"}]},
		  "legacyEnum":{"type":"string","description":"Select one option (legacy)","enum":["opt1","opt2","opt3"],
		    "enumNames":["Option One","Option Two","Option Three"]},
		  "untitledMulti":{"type":"array","description":"Select multiple options","minItems":1,"maxItems":3,
		    "items":{"type":"string","enum":["option1","option2","option3"]}},
		  "titledMulti":{"type":"array","description":"Select multiple options with titles","minItems":1,"maxItems":3,
		    "items":{"anyOf":[{"const":"value1","title":"First Choice"},{"const":"value2","title":"Second Choice"},{"const":"value3","title":"Third Choice"}]}}},
		  "required":[]}`)
	add("json_schema_2020_12_tool", "a JSON Schema 2020-12 input schema (SEP-1613)",
		json.RawMessage(`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",
		  "$defs":{"address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"}}}},
		  "properties":{"name":{"type":"string"},"address":{"$ref":"#/$defs/address"}},"additionalProperties":false}`),
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return text("JSON Schema 2020-12 tool called with: " + string(req.Params.Arguments)), nil
		})
}

// notify sends a notification related to the current request (ctx), on its response stream.
// The SDK's Log method sends nothing until the client has set a level; the scenarios expect
// the tool's log messages regardless, as other SDKs send them.
func notify(ctx context.Context, ss *mcp.ServerSession, method string, params map[string]any) error {
	if method != "notifications/message" {
		return fmt.Errorf("notify %s: unsupported", method)
	}
	level, _ := params["level"].(string)
	err := ss.Log(ctx, &mcp.LoggingMessageParams{Level: mcp.LoggingLevel(level), Logger: "conformance", Data: params["data"]}) //nolint:staticcheck // the scenario tests logging
	if err != nil {
		return fmt.Errorf("log: %w", err)
	}
	return nil
}

func (s *Server) addResources(srv *mcp.Server) {
	static := func(uri, name, mime string, c mcp.ResourceContents) {
		srv.AddResource(&mcp.Resource{URI: uri, Name: name, MIMEType: mime},
			func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
				rc := c
				return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{&rc}}, nil
			})
	}
	static("test://static-text", "static-text", "text/plain", mcp.ResourceContents{
		URI: "test://static-text", MIMEType: "text/plain", Text: "This is the content of the static text resource."})
	static("test://static-binary", "static-binary", "image/png", mcp.ResourceContents{
		URI: "test://static-binary", MIMEType: "image/png", Blob: png})
	static("test://watched-resource", "watched-resource", "text/plain", mcp.ResourceContents{
		URI: "test://watched-resource", MIMEType: "text/plain", Text: "Watched resource content"})
	srv.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "test://template/{id}/data", Name: "template", MIMEType: "application/json"},
		func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			uri := req.Params.URI
			id := strings.TrimSuffix(strings.TrimPrefix(uri, "test://template/"), "/data")
			body, _ := json.Marshal(map[string]any{"id": id, "templateTest": true, "data": "Data for ID: " + id})
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(body)}}}, nil
		})
}

func (s *Server) addPrompts(srv *mcp.Server) {
	msgs := func(ms ...*mcp.PromptMessage) *mcp.GetPromptResult { return &mcp.GetPromptResult{Messages: ms} }
	user := func(c mcp.Content) *mcp.PromptMessage { return &mcp.PromptMessage{Role: "user", Content: c} }
	srv.AddPrompt(&mcp.Prompt{Name: "test_simple_prompt", Description: "a prompt without arguments"},
		func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return msgs(user(&mcp.TextContent{Text: "This is a simple prompt for testing."})), nil
		})
	srv.AddPrompt(&mcp.Prompt{Name: "test_prompt_with_arguments", Description: "a prompt with required arguments",
		Arguments: []*mcp.PromptArgument{{Name: "arg1", Description: "First test argument", Required: true},
			{Name: "arg2", Description: "Second test argument", Required: true}}},
		func(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			a := req.Params.Arguments
			return msgs(user(&mcp.TextContent{Text: fmt.Sprintf("Prompt with arguments: arg1='%s', arg2='%s'", a["arg1"], a["arg2"])})), nil
		})
	srv.AddPrompt(&mcp.Prompt{Name: "test_prompt_with_embedded_resource", Description: "a prompt with an embedded resource",
		Arguments: []*mcp.PromptArgument{{Name: "resourceUri", Description: "URI of the resource to embed", Required: true}}},
		func(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return msgs(
				user(&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: req.Params.Arguments["resourceUri"],
					MIMEType: "text/plain", Text: "Embedded resource content for testing."}}),
				user(&mcp.TextContent{Text: "Please process the embedded resource above."})), nil
		})
	srv.AddPrompt(&mcp.Prompt{Name: "test_prompt_with_image", Description: "a prompt with image content"},
		func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return msgs(user(&mcp.ImageContent{Data: png, MIMEType: "image/png"}),
				user(&mcp.TextContent{Text: "Please analyze the image above."})), nil
		})
}
